"""The non-finite guard's stop message: where the loss itself was non-finite (an infinite
finetune.beta, say), it names the loss's settings instead of leaving the first parameter its
gradient reached (the embedding) to take the blame."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tinytrain.errors import TrainingStopped
from tinytrain.train.callbacks import nonfinite_guard
from tinytrain.train.callbacks.nonfinite_guard import NonFiniteGuard

DPO = "finetune.objective=dpo finetune.beta=inf"


class Module(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(2, 2)

    def remember_grad_norm(self, norm) -> None:
        pass


def stop_message(tmp_path, monkeypatch, loss: float, loss_settings: str | None) -> str:
    monkeypatch.setattr(nonfinite_guard, "write_step_row_now", lambda trainer, force, fresh=None: None)
    trainer = SimpleNamespace(precision_plugin=SimpleNamespace(), strategy=object(), global_step=3, save_checkpoint=lambda path: None)
    module = Module()
    guard = NonFiniteGuard("stop", 0, tmp_path, loss_settings)
    guard.on_before_backward(trainer, module, torch.tensor(loss))
    for p in module.parameters():
        p.grad = torch.full_like(p, float("nan"))
    with pytest.raises(TrainingStopped) as e:
        guard.on_before_optimizer_step(trainer, module, None)
    return str(e.value)


def test_a_nonfinite_loss_names_the_preference_settings(tmp_path, monkeypatch):
    message = stop_message(tmp_path, monkeypatch, float("inf"), DPO)
    assert "first non-finite gradient (forward order) in embed.weight" in message
    assert f"the loss itself is inf, before any gradient: check its settings ({DPO})" in message


def test_a_finite_loss_keeps_the_usual_fix(tmp_path, monkeypatch):
    message = stop_message(tmp_path, monkeypatch, 1.5, DPO)
    assert "the loss itself" not in message and "Fix: lower trainer.lr" in message

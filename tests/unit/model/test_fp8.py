"""precision.fp8 (plan/fp8.py, model/fp8.py): what auto and true decide per GPU, and torchao's
emulated float8 on CPU: the block projections converted, the head kept, the weights' names
unchanged, the loss within a stated bound of the full-precision one."""

from types import SimpleNamespace

import pytest
import torch

from tinytrain.errors import ConfigError
from tinytrain.plan import fp8
from tinytrain.plan.hardware import CPU, lookup_gpu

H100, A100 = lookup_gpu("H100"), lookup_gpu("A100")


def cfg(value, emulate=False, request="auto"):
    return SimpleNamespace(precision=SimpleNamespace(fp8=value, fp8_emulate=emulate, request=request))


@pytest.mark.parametrize(
    ("value", "hardware", "hidden", "enabled"),
    [("auto", H100, 4096, True), ("auto", H100, 2048, False), ("auto", A100, 8192, False), ("auto", CPU(), 8192, False), (False, H100, 8192, False), (True, H100, 64, True), ("true", CPU(), 64, None)],
)
def test_auto_and_true_per_gpu(value, hardware, hidden, enabled):
    decide = lambda c: fp8.decide(c, hardware, hidden=hidden, strategy_blocker=None, finetune=False, planning=True, available=True)  # noqa: E731
    if enabled is None:
        with pytest.raises(ConfigError, match="compute capability >= 8.9"):
            decide(cfg(value))
        assert decide(cfg(value, emulate=True)).emulate  # torchao's emulation runs anywhere
        return
    assert decide(cfg(value)).enabled is enabled
    assert not fp8.decide(cfg("auto"), H100, hidden=8192, strategy_blocker="not checked", finetune=False, planning=True, available=True).enabled


def test_true_without_torchao_is_noted_in_a_plan_and_refused_where_it_runs():
    planned = fp8.decide(cfg(True), H100, hidden=8192, strategy_blocker=None, finetune=False, planning=True, available=False)
    assert planned.enabled and "torchao is not installed on this machine: the one that trains needs it" in planned.reason
    with pytest.raises(ConfigError, match="needs torchao"):
        fp8.decide(cfg(True), H100, hidden=8192, strategy_blocker=None, finetune=False, planning=False, available=False)


def test_auto_keeps_an_fp32_run_in_fp32_and_emulation_needs_fp8():
    def decide(c, **kw):
        return fp8.decide(c, H100, hidden=8192, strategy_blocker=None, finetune=False, planning=True, available=True, **kw)

    off = decide(cfg("auto"), fp32=True)
    assert not off.enabled and "trains in fp32 (precision=auto chose it here)" in off.reason  # it said precision=fp32
    assert "trains in fp32 (precision=fp32)" in decide(cfg("auto", request="fp32"), fp32=True).reason
    assert decide(cfg(True), fp32=True).enabled  # asked for by name: converted
    with pytest.raises(ConfigError, match=r"precision.fp8_emulate=true: .* precision.fp8=false turns off"):
        decide(cfg(False, emulate=True))


def test_emulated_float8_converts_the_blocks_and_tracks_the_loss():
    pytest.importorskip("torchao", reason="torchao (the fp8 extra) is not installed")
    from tests.unit.model.test_activation_checkpointing import BATCH, tiny_llama
    from tinytrain.model.fp8 import apply_fp8

    reference, model = tiny_llama(), tiny_llama()
    names = list(model.state_dict())
    assert apply_fp8(model, emulate=True) == 3 * 7  # q, k, v, o, gate, up, down of 3 layers
    assert type(model.lm_head) is torch.nn.Linear and list(model.state_dict()) == names
    ours, theirs = model(input_ids=BATCH, labels=BATCH).loss, reference(input_ids=BATCH, labels=BATCH).loss.detach()
    # e4m3 keeps 3 mantissa bits: per-tensor scaled, a fresh model's loss moves by well under 1%
    assert abs(ours.item() - theirs.item()) < 0.01 * theirs.item()
    ours.backward()
    assert model.model.layers[0].mlp.up_proj.weight.grad.abs().sum() > 0

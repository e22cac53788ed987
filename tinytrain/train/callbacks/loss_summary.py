"""Remembers the training loss of every step this run trains, so the end of a run can print the
first and last, and the means of the first and last few steps (one batch's loss is noisy: a LoRA
run printed 6.25 -> 7.18 while its validation loss fell).

Each micro batch's loss stays on the device until the next optimizer step's gradients are done
(or the losses are asked for), then they are read together: a read per micro batch would make the
host wait for each micro batch to finish before it queues the next one's work, a stall per micro
batch of a gradient accumulation. Before the update the non-finite guard and the clipping wait for
the backward anyway; read after it, the host would wait for the update too."""

from __future__ import annotations

import lightning.pytorch as pl
import torch

from tinytrain.model.guard_report import accumulation_boundary
from tinytrain.model.module import rank_token_mean


class LossSummary(pl.Callback):
    """Per optimizer step: the mean of its micro batches' losses. Lightning hands each micro batch's
    loss divided by the accumulation (what its backward takes), so a step's is their sum."""

    def __init__(self):
        self._steps: list[float] = []  # one per optimizer step, in order
        self._pending: list[tuple[int, torch.Tensor]] = []  # (step of this process, micro batch's share)
        self._micro_batches = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = rank_token_mean((outputs["loss"] if isinstance(outputs, dict) else outputs).detach().float().reshape(()), pl_module)
        accumulation = trainer.accumulate_grad_batches if trainer is not None else 1
        self._pending.append((self._micro_batches // accumulation, loss))
        self._micro_batches += 1

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if accumulation_boundary(trainer):
            self._read()  # the earlier micro batches' (this step's last one ends after the update)

    def _read(self) -> None:
        if not self._pending:
            return
        values = torch.stack([share for _, share in self._pending]).tolist()  # one transfer
        for (step, _), value in zip(self._pending, values):
            if step < len(self._steps):
                self._steps[step] += value
            else:
                self._steps.append(value)
        self._pending = []

    @property
    def losses(self) -> list[float]:
        self._read()
        return self._steps

    @property
    def first(self) -> float | None:
        return self.losses[0] if self.losses else None

    @property
    def last(self) -> float | None:
        return self.losses[-1] if self.losses else None

    @property
    def window(self) -> int:
        """Steps averaged at each end: a quarter of the run, 1 to 10 (never overlapping)."""
        return max(1, min(10, len(self.losses) // 4))

    def means(self) -> tuple[float, float] | None:
        """(mean of the first `window` steps, mean of the last `window`)."""
        if not self.losses:
            return None
        k = self.window
        return sum(self.losses[:k]) / k, sum(self.losses[-k:]) / k

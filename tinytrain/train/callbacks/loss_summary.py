"""Remembers the training loss of every step this run trains, so the end of a run can print the
first and last, and the means of the first and last few steps (one batch's loss is noisy: a LoRA
run printed 6.25 -> 7.18 while its validation loss fell)."""

from __future__ import annotations

import lightning.pytorch as pl


class LossSummary(pl.Callback):
    def __init__(self):
        self.losses: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        self.losses.append(float(loss.detach()))

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

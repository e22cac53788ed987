"""Remembers the first and last training loss so the end of a run can print both."""

from __future__ import annotations

import lightning.pytorch as pl


class LossSummary(pl.Callback):
    def __init__(self):
        self.first: float | None = None
        self.last: float | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        value = float(loss.detach())
        if self.first is None:
            self.first = value
        self.last = value

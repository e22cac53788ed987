"""Tokens per second, per process, logged with the other metrics."""

from __future__ import annotations

import time

import lightning.pytorch as pl


class TokensPerSecond(pl.Callback):
    """Time between consecutive optimizer steps, over the tokens each step consumed.

    Includes data loading and everything else the loop does, so it is what a user gets.
    """

    def __init__(self, tokens_per_step_per_process: int):
        self.tokens = tokens_per_step_per_process
        self._last: float | None = None
        self._last_step = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == self._last_step:  # inside gradient accumulation
            return
        now = time.perf_counter()
        if self._last is not None:
            elapsed = now - self._last
            steps = step - self._last_step
            pl_module.log("tokens_per_s", self.tokens * steps / elapsed, prog_bar=True)
        self._last, self._last_step = now, step

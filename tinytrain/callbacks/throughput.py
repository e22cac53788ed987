"""Tokens per second, per process, logged with the other metrics."""

from __future__ import annotations

import time

import lightning.pytorch as pl


def batch_tokens(batch: dict) -> int:
    """Tokens in a batch; padding excluded where an attention mask marks it (padded SFT batches
    are narrower than seq_len and vary, so a fixed tokens-per-step would overstate)."""
    mask = batch.get("attention_mask")
    return int(mask.sum()) if mask is not None else batch["input_ids"].numel()


class TokensPerSecond(pl.Callback):
    """Time between consecutive optimizer steps, over the tokens of the batches in between.

    Includes data loading and everything else the loop does, so it is what a user gets.
    """

    def __init__(self):
        self._last: float | None = None
        self._last_step = 0
        self._tokens = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self._tokens += batch_tokens(batch)
        step = trainer.global_step
        if step == self._last_step:  # inside gradient accumulation
            return
        now = time.perf_counter()
        if self._last is not None:
            pl_module.log("tokens_per_s", self._tokens / (now - self._last), prog_bar=True)
        self._last, self._last_step, self._tokens = now, step, 0

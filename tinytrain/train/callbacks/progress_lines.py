"""Progress where no terminal reads it (a Slurm log file, CI): a plain log line every few optimizer
steps instead of the progress bar, whose carriage returns turn a log file into one long line."""

from __future__ import annotations

import logging
import sys

import lightning.pytorch as pl

log = logging.getLogger(__name__)


def bar_on_terminal(requested: bool) -> bool:
    """The progress bar only where stderr (tqdm's stream) is a terminal."""
    return requested and sys.stderr.isatty()


class ProgressLines(pl.Callback):
    def __init__(self, every_n_steps: int, max_steps: int):
        self.every = max(1, every_n_steps)
        self.max_steps = max_steps
        self.last_step = -1

    def on_train_start(self, trainer, pl_module):
        # The step already done (0, or a resumed checkpoint's): a line comes when the next one ends,
        # not after the first micro batch of an accumulation.
        self.last_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == self.last_step or not trainer.is_global_zero:  # inside gradient accumulation; rank 0 says it
            return
        self.last_step = step
        if step % self.every and step != self.max_steps:
            return
        metrics = trainer.callback_metrics
        parts = [f"{key} {float(metrics[key]):{fmt}}" for key, fmt in (("loss", ".4f"), ("lr", ".3e"), ("tokens_per_s", ",.0f")) if key in metrics]
        log.info("step %d/%d: %s", step, self.max_steps, ", ".join(parts))

"""Validation at the last step: trainer.val_every_n_steps validates at its multiples, and a run
whose trainer.max_steps is not one (the defaults: 250 steps, every 100) reported the step-200
val_loss as its final one, to the summary, result.json and a sweep's ranking, while the last 50
steps, where the rate decays, went unmeasured.

Lightning validates a step whose callbacks ask the run to stop (`trainer.should_stop`, its
training epoch loop's `_should_check_val_fx`), so the last step asks it: the run ends there
anyway; Lightning also writes that step's metrics row, off the logging interval or not.
StepCheckpoints counts the last step as a validating one (`validates_at`), so its checkpoint
waits for the row. Only runs with validation data (train/fit.py) ask it.
"""

from __future__ import annotations

import lightning.pytorch as pl


def validates_at(step: int, *, val_every_n_steps: int, max_steps: int) -> bool:
    """Whether the run validates after optimizer step `step` (0 validation interval: never;
    `max_steps` 0: not at the last step unless on the interval)."""
    return bool(val_every_n_steps) and (step % val_every_n_steps == 0 or step == max_steps)


class FinalValidation(pl.Callback):
    def __init__(self, max_steps: int, val_every_n_steps: int):
        self.max_steps = max_steps
        self.val_every_n_steps = val_every_n_steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == self.max_steps and step % self.val_every_n_steps:
            trainer.should_stop = True

"""Checkpoints every N optimizer steps as `checkpoints/step<N:07d>.ckpt`, keeping the newest K.

Each save goes through the strategy's atomic write (checkpoint_io.py), and older step
checkpoints are pruned only after the new one is in place, so the folder always holds a complete
one. Pruning reads the folder rather than remembering what this process saved: after a requeue the
checkpoints of the earlier segments count too. `resume=auto` picks the newest of these files
(tinytrain/checkpoint/resume.py); the preemption callback saves through `save()` as well.

A `Checkpoint` subclass: Lightning runs checkpoint callbacks after all others, so the data
position (callbacks/data_position.py) has counted the batch before it is saved.

At a step that also validates, the save waits for the validation: a process killed between the
two would otherwise leave a checkpoint whose step's validation row never gets written (the resumed
run starts after it). Should Lightning not validate after all, the save happens before the next
batch or at the end of training.
"""

from __future__ import annotations

import logging
from pathlib import Path

from lightning.pytorch.callbacks import Checkpoint

from tinytrain.checkpoint.files import prune, step_checkpoint_name
from tinytrain.train.callbacks.final_validation import validates_at
from tinytrain.train.metrics_csv import write_step_row_now

log = logging.getLogger(__name__)


class StepCheckpoints(Checkpoint):
    def __init__(self, directory: Path, every_n_steps: int, keep_last: int, val_every_n_steps: int = 0, max_steps: int = 0):
        self.directory = Path(directory)
        self.every_n_steps = every_n_steps
        self.keep_last = keep_last
        self.val_every_n_steps = val_every_n_steps  # 0: no validation
        self.max_steps = max_steps  # validated too (callbacks/final_validation.py); 0: not
        self.last_saved_step: int | None = None
        self.waiting_for_validation = False

    def on_train_start(self, trainer, pl_module):
        # A resumed run starts at the checkpoint's step: that one exists already.
        self.last_saved_step = trainer.global_step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # Under gradient accumulation this runs for every micro batch; global_step moves once per
        # optimizer step, and last_saved_step keeps one save per step.
        step = trainer.global_step
        if step % self.every_n_steps != 0:
            return
        if self.validates_at(step):
            self.waiting_for_validation = True
        else:
            self.save(trainer)

    def validates_at(self, step: int) -> bool:
        return validates_at(step, val_every_n_steps=self.val_every_n_steps, max_steps=self.max_steps)

    def on_validation_end(self, trainer, pl_module):
        self.save_if_waiting(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.save_if_waiting(trainer)

    def on_train_end(self, trainer, pl_module):
        self.save_if_waiting(trainer)

    def save_if_waiting(self, trainer) -> None:
        if self.waiting_for_validation and not trainer.sanity_checking:
            self.waiting_for_validation = False
            # Lightning has written the step's row (and the validation's) by now.
            self.save(trainer, row_written=True)

    def save(self, trainer, row_written: bool = False) -> Path:
        """Save this step's checkpoint (every rank calls this) unless it exists; prune on rank 0."""
        path = self.directory / step_checkpoint_name(trainer.global_step)
        if self.last_saved_step == trainer.global_step:
            return path
        if not row_written:
            # The step's metrics row is on disk before its checkpoint: a resume from it keeps the row.
            write_step_row_now(trainer)
        trainer.save_checkpoint(path)
        self.last_saved_step = trainer.global_step
        if trainer.is_global_zero:
            # An async save (fsdp_tp, checkpoint.async_save) is in place only when written: the
            # older ones go after that, from the writer's thread.
            when_published = getattr(trainer.strategy, "after_checkpoint_published", lambda action: action())
            when_published(self.prune)
        return path

    def prune(self) -> None:
        for old in prune(self.directory, self.keep_last):
            log.debug("removed %s (checkpoint.keep_last=%d)", old, self.keep_last)

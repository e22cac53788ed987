"""A run resumed under another gradient accumulation: Lightning's batch counters re-counted in it.

Lightning counts micro batches, and reads the count restored from a checkpoint under the new
accumulation: which micro batch ends a step (`current.ready % accumulation`), when validation is due
(every `val_every_n_steps x accumulation` micro batches, from `total.ready`) and the step a metrics
row is labelled with. A step-4 checkpoint of accumulation 1 resumed under 2 validated at step 6
instead of 8 and labelled each row a step low. Each checkpoint records its accumulation here; a run
under another one shifts the counters to its own count of the same optimizer steps before Lightning
restores them (callbacks are restored before the loops). On every resume this epoch's count is
then set from the sampler, which continues at the checkpoint's sample: under another accumulation
(counted as steps x the new one) or world size (each rank's count of the old world) it ran ahead
of the sampler's pass, Lightning ended its epoch early and the `epoch` column of every later row
was one ahead. Under the same layout the two counts agree.

The row count is also put right at each step's start: a checkpoint taken after its step's
validation (callbacks/step_checkpoints.py waits for it) holds it one low, and Lightning adds the
one back only when the resumed run validates at that step too. Resumed under another
val_every_n_steps, or past an earlier run's last step, every later row was labelled a step low.
"""

from __future__ import annotations

import logging

import lightning.pytorch as pl

log = logging.getLogger(__name__)

KEY = "accumulate_grad_batches"


class AccumulationChange(pl.Callback):
    def __init__(self, accumulation: int, sampler=None):
        self.accumulation = accumulation
        self.sampler = sampler  # the training sampler (data/): what is left of its pass, where it knows
        self.resumed = False

    def on_train_start(self, trainer, pl_module):
        # After the loops are restored, before the epoch loop's restart. Shifted together: a checkpoint
        # saved at a batch's end holds `completed` one behind, which the restart adds back.
        remaining = self.sampler.pass_remaining() if self.resumed and hasattr(self.sampler, "pass_remaining") else None
        if remaining is None:
            return
        current = trainer.fit_loop.epoch_loop.batch_progress.current
        shift = max(0, len(self.sampler) - remaining) - current.ready
        for name in ("ready", "started", "processed", "completed"):
            setattr(current, name, getattr(current, name) + shift)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        # Lightning labels rows with `_batches_that_stepped`, saved one low by a checkpoint taken after
        # its step's validation, and adds the missing one back on restart only when the resumed run
        # validates at that step too (its `_skip_next_val` path). At a step's start it equals the
        # optimizer steps taken.
        loop = trainer.fit_loop.epoch_loop
        if loop._batches_that_stepped != trainer.global_step:
            loop._batches_that_stepped = trainer.global_step

    def state_dict(self) -> dict:
        return {KEY: self.accumulation}

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        saved = checkpoint.get("callbacks", {}).get(self.state_key, {}).get(KEY)
        progress = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.batch_progress")
        self.resumed = progress is not None
        if saved in (None, self.accumulation) or progress is None:  # unchanged, or saved before it was recorded
            return
        steps = progress["current"]["ready"] // saved  # this epoch's: checkpoints are taken at step ends
        # Each counter in its own steps: the run's total spans every epoch (whole steps each,
        # data/sampler.py), the current one this epoch's; one shift for both was right in epoch 0 only.
        for counters in (progress["total"], progress["current"]):
            shift = counters["ready"] // saved * self.accumulation - counters["ready"]
            for name in ("ready", "started", "processed", "completed"):
                counters[name] += shift
        log.info("gradient accumulation %d -> %d since the checkpoint: its %d step(s) of this epoch are %d micro batches now", saved, self.accumulation, steps, steps * self.accumulation)

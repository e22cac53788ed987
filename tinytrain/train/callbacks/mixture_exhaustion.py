"""data.exhaustion=stop: the run ends at the last optimizer step before a mixture source would start
a second pass, saves a step checkpoint there and says which source ran out at which step.

The stream of samples is fixed by the seed (data/mixture_sampler.py), so every rank reaches the same
decision from its own copy of the sampler, with no collective. The check looks one optimizer step
ahead (accumulation x data-parallel batches) after the data position has counted the step's
batches (DataPosition runs before this callback). A source too small for even the first step is a
configuration error (plan/mixture.py); a resumed run that has nothing left ends at once, as it ended before.
"""

from __future__ import annotations

import logging

import lightning.pytorch as pl

from tinytrain.checkpoint.files import step_checkpoint_name
from tinytrain.train.callbacks.step_checkpoints import StepCheckpoints

log = logging.getLogger(__name__)


class MixtureExhaustion(pl.Callback):
    def __init__(self, sampler, keys: list[str], accumulate_grad_batches: int):
        self.sampler = sampler  # data/mixture_sampler.py MixtureBatchSampler
        self.keys = keys  # data.sources[i].path of each source, for messages
        self.accumulate = accumulate_grad_batches
        self.step_seen = 0
        self.message: str | None = None

    def on_train_start(self, trainer, pl_module):
        self.step_seen = trainer.global_step
        k = self._next_step_exhausts()
        if k is not None:  # resumed from the checkpoint of a run that ended here: it exists already
            self._stop(trainer, k, save=False)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step_seen:  # inside gradient accumulation
            return
        self.step_seen = trainer.global_step
        if trainer.max_steps > 0 and trainer.global_step >= trainer.max_steps:
            return  # the run ends here anyway
        k = self._next_step_exhausts()
        if k is not None:
            self._stop(trainer, k, save=True)

    def _next_step_exhausts(self) -> int | None:
        return self.sampler.first_exhausted(self.accumulate * self.sampler.world)

    def _stop(self, trainer, k: int, save: bool) -> None:
        s = self.sampler
        checkpoints = next(c for c in trainer.checkpoint_callbacks if isinstance(c, StepCheckpoints))
        path = checkpoints.save(trainer) if save else checkpoints.directory / step_checkpoint_name(trainer.global_step)
        saved = f"; checkpoint {path.parent.name}/{path.name}"
        drawn = int(s.positions_at(s.samples_consumed)[k])
        self.message = (
            f"data: mixture source {s.names[k]!r} ({self.keys[k]}) ran out at step {trainer.global_step}: {drawn:,} of its {s.sizes[k]:,} items "
            f"drawn, and step {trainer.global_step + 1} would draw more than are left (data.exhaustion=stop); the run ends here{saved}"
        )
        if trainer.is_global_zero:  # every rank decides the same; one says so
            log.warning("%s", self.message)
        trainer.should_stop = True

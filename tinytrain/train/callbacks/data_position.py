"""Puts the training sampler's position into every checkpoint and restores it on resume, so a
resumed run continues after the last batch it trained on (nothing repeated, nothing skipped)."""

from __future__ import annotations

import lightning.pytorch as pl

from tinytrain.data.mixture_sampler import MixtureBatchSampler
from tinytrain.data.ramp_sampler import RampBatchSampler
from tinytrain.data.sampler import ResumableBatchSampler


class DataPosition(pl.Callback):
    def __init__(self, sampler, context_parallel: int = 1):
        self.sampler = sampler  # data/sampler.py ResumableBatchSampler
        self.context_parallel = context_parallel

    def setup(self, trainer, pl_module, stage):
        # The strategy knows the data-parallel layout (with tensor parallelism, dp rank != global rank).
        shard = getattr(trainer.strategy, "distributed_sampler_kwargs", None)
        if shard:
            # The cp consecutive ranks of a context-parallel group share each batch (DeepSpeed sees
            # them all as data-parallel ranks; model/context_parallel.py splits the sequence).
            cp = self.context_parallel
            self.sampler.set_shard(shard["rank"] // cp, shard["num_replicas"] // cp)
        if isinstance(self.sampler, ResumableBatchSampler | MixtureBatchSampler):  # passes of whole optimizer steps
            self.sampler.accumulation = trainer.accumulate_grad_batches

    def on_train_start(self, trainer, pl_module):
        # A batch ramp sizes the next batch by the run's optimizer step: a checkpoint from a run
        # without one (a new stage) carries no step of its own, so the trainer's is taken.
        if isinstance(self.sampler, RampBatchSampler) and self.sampler.steps != trainer.global_step:
            self.sampler.steps, self.sampler.micro_batches = trainer.global_step, 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # Counted here, not when the sampler yields: loader workers and Lightning prefetch ahead.
        # Runs before StepCheckpoints (Lightning calls checkpoint callbacks last) and before the
        # preemption save (listed after this callback), so a checkpoint saved after this batch counts it.
        self.sampler.advance()

    def state_dict(self) -> dict:
        return self.sampler.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.sampler.load_state_dict(state_dict)

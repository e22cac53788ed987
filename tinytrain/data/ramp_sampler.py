"""The training sampler under trainer.batch_size_warmup: micro batches that grow with the step.

Like ResumableBatchSampler (data/sampler.py), batches are formed globally from the epoch's order
and dealt round-robin to the data-parallel ranks, and the position is checkpointed; here it is
counted in samples (the batches vary in size) plus the optimizer steps trained, which is what
sizes the next batch (data/batch_ramp.py). Step k takes the next micro(k) x per_step samples of the
order, micro batch j of them going to rank j mod world; a pass ends at the last whole step that
fits, so an epoch never ends inside a step's accumulation. A position saved on another data-parallel
size resumes at the same sample and step (the global batch, hence per_step x micro, is the same).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np

from tinytrain.data.batch_ramp import BatchRamp
from tinytrain.data.sampler import ResumableBatchSampler


class RampBatchSampler(ResumableBatchSampler):
    def __init__(self, num_samples: int, ramp: BatchRamp, seed: int, orders: Callable[[int], np.ndarray] | None = None):
        super().__init__(num_samples, ramp.final // ramp.increment, seed, shuffle=True, drop_last=True, orders=orders)
        self.ramp = ramp
        self.samples = 0  # samples of this epoch already trained on
        self.steps = 0  # optimizer steps trained in the run (sizes the next micro batch)
        self.micro_batches = 0  # this step's micro batches already trained on (all ranks)
        self.epoch_start_step = 0  # the run's step at which this pass began (its length from there)

    @property
    def per_step(self) -> int:
        """Micro batches in one optimizer step over all ranks: data_parallel x accumulation."""
        return self.ramp.increment

    def _pass_steps(self, first_step: int, samples: int) -> int:
        """Whole steps that fit in a pass from `samples` on, starting at run step `first_step`."""
        n, step = 0, first_step
        while samples + self.ramp.batch(step) <= self.num_samples:
            samples += self.ramp.batch(step)
            step, n = step + 1, n + 1
        return n

    def __iter__(self) -> Iterator[list[int]]:
        if self.micro_batches == 0 and self.samples + self.ramp.batch(self.steps) > self.num_samples:
            self.epoch, self.samples, self.epoch_start_step = self.epoch + 1, 0, self.steps
        order = self._epoch_order(self.epoch)
        pos, step = self.samples, self.steps
        skip = self.micro_batches  # a position saved inside a step (not at a checkpoint: steps end them)
        while pos + self.ramp.batch(step) <= self.num_samples:
            m = self.ramp.micro(step)
            for j in range(skip + self.rank, self.per_step, self.world):
                yield order[pos + j * m : pos + (j + 1) * m].tolist()
            pos, step, skip = pos + m * self.per_step, step + 1, 0

    def __len__(self) -> int:
        """Micro batches per pass on this rank, counted from the pass's first step (Lightning counts
        the ones trained before a resume itself)."""
        return self._pass_steps(self.epoch_start_step, 0) * self.per_step // self.world

    def pass_remaining(self) -> None:
        """Not counted in batches of one size (a pass's micro batches grow with the ramp): Lightning's
        count of the epoch is left as the checkpoint holds it (callbacks/accumulation_change.py)."""
        return None

    def _step_start(self) -> int:
        """The sample in the epoch's order where the step being trained began."""
        return self.samples - self.micro_batches * self.ramp.micro(self.steps)  # each micro batch trained so far moved it m

    def current_step(self) -> list[list[int]]:
        """Every rank's micro batches of the step being trained (train/callbacks/step_tokens.py):
        per_step micro batches of this step's size, from where the step began in the order."""
        m = self.ramp.micro(self.steps)
        start = self._step_start()
        order = self._epoch_order(self.epoch)
        return [order[start + j * m : start + (j + 1) * m].tolist() for j in range(self.per_step)]

    def advance(self) -> None:
        """One micro batch was trained on by every rank."""
        self.samples += self.ramp.micro(self.steps) * self.world
        self.micro_batches += self.world
        if self.micro_batches >= self.per_step:
            self.steps, self.micro_batches = self.steps + 1, 0

    def state_dict(self) -> dict:
        return {**super().state_dict(), "samples": self.samples, "steps": self.steps, "micro_batches": self.micro_batches, "epoch_start_step": self.epoch_start_step, "ramp": [self.ramp.start, self.ramp.final]}

    def load_state_dict(self, state: dict) -> None:
        if "samples" not in state or (state["num_samples"], state["seed"], state["ramp"]) != (self.num_samples, self.seed, [self.ramp.start, self.ramp.final]):
            super().load_state_dict({**state, "num_samples": -1})  # another data or ramp: warns, starts the epoch from its first batch
            self.samples, self.steps, self.micro_batches, self.epoch_start_step = 0, 0, 0, 0
            return
        self.epoch, self.samples, self.steps, self.epoch_start_step = state["epoch"], state["samples"], state["steps"], state["epoch_start_step"]
        self.micro_batches = state["micro_batches"]

"""A batch sampler whose position is a checkpointable pair (epoch, batches consumed).

The batch order of an epoch is a pure function of (seed, epoch, dataset size, batch size), so a
resumed run rebuilds it and continues after the last batch the model trained on: nothing repeated,
nothing skipped, and the same order as a run that was never interrupted. Consumption is counted by the training loop (callbacks/data_position.py), not by
iteration, because DataLoader workers and Lightning's fetcher read ahead of training.

Batches are formed globally and dealt round-robin to data-parallel ranks, and the position is kept
in global batches, so the same checkpoint resumes on another world size at the same sample.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

import numpy as np
from torch.utils.data import Sampler

log = logging.getLogger(__name__)

MEGABATCH = 64  # length grouping sorts within groups of this many batches, so order stays random


def pass_span(consumed: int, batches: int, world: int) -> tuple[bool, int, int]:
    """(a new pass starts, first, end): the global batches of a pass of `batches` this run trains,
    `world` a round (or an optimizer step's micro batches over every rank). The position `consumed`
    need not be a multiple of `world` (saved on another world size): the pass goes on at the first
    batch not trained on and ends where every rank still gets one; when not one round is left, the
    next pass starts at 0."""
    new_pass = consumed + world > batches
    first = 0 if new_pass else consumed
    return new_pass, first, first + (batches - first) // world * world


def rank_batches_left(consumed: int, batches: int, step_batches: int, world: int) -> int:
    """Batches each of `world` ranks has left in the pass pass_span continues (0: a new pass starts)."""
    new_pass, first, end = pass_span(consumed, batches, step_batches)
    return 0 if new_pass else (end - first) // world


class ResumableBatchSampler(Sampler[list[int]]):
    def __init__(self, num_samples: int, batch_size: int, seed: int, shuffle: bool = True, drop_last: bool = True, lengths: Sequence[int] | None = None, orders: Callable[[int], np.ndarray] | None = None):
        """`orders(epoch)`: the epoch's permutation from elsewhere (sample_index.EpochOrders: written
        once, memory-mapped); it must equal np.random.default_rng([seed, epoch]).permutation(n)."""
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.seed = seed
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.lengths = None if lengths is None else np.asarray(lengths)
        self.orders = orders
        self.epoch = 0
        self.consumed = 0  # global batches of this epoch already trained on
        self.rank, self.world = 0, 1
        # Micro batches per optimizer step on each rank: a pass ends on a whole step, so no step's
        # accumulation runs into the next epoch (DeepSpeed's engine would accumulate on across it
        # while Lightning's count of the epoch's micro batches starts again) and each step's
        # batches are known.
        self.accumulation = 1
        self.pass_first = 0  # where this pass started (its steps are counted from there)
        self._grouped: tuple[int, list[list[int]]] | None = None
        self._order: tuple[int, np.ndarray] | None = None

    def set_shard(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    @property
    def step_batches(self) -> int:
        """Global micro batches per optimizer step: a round of every rank, `accumulation` times."""
        return self.world * self.accumulation

    def all_batches(self) -> int:
        """Global batches of an epoch, untrimmed."""
        full, rest = divmod(self.num_samples, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def num_batches(self) -> int:
        """Global batches of an epoch, trimmed to whole optimizer steps (each rank as many)."""
        n = self.all_batches()
        return n - n % self.step_batches

    def batch(self, epoch: int, b: int) -> list[int]:
        """Global batch b of an epoch: computed from the epoch's order, never a list of all batches
        (that would be ~50 bytes per sample in every rank)."""
        if self.lengths is not None and self.shuffle:
            if self._grouped is None or self._grouped[0] != epoch:
                self._grouped = (epoch, self._grouped_by_length(epoch))
            return self._grouped[1][b]
        lo, hi = b * self.batch_size, min((b + 1) * self.batch_size, self.num_samples)
        if not self.shuffle:
            return list(range(lo, hi))
        return self._epoch_order(epoch)[lo:hi].tolist()

    def _epoch_order(self, epoch: int) -> np.ndarray:
        if self._order is None or self._order[0] != epoch:
            order = self.orders(epoch) if self.orders is not None else np.random.default_rng([self.seed, epoch]).permutation(self.num_samples)
            self._order = (epoch, order)
        return self._order[1]

    def global_batches(self, epoch: int) -> list[list[int]]:
        """Every batch of an epoch, in order (for tests and small data)."""
        return [self.batch(epoch, b) for b in range(self.num_batches())]

    def _cut(self, order: np.ndarray) -> list[list[int]]:
        batches = [order[i : i + self.batch_size].tolist() for i in range(0, len(order), self.batch_size)]
        if self.drop_last and batches and len(batches[-1]) < self.batch_size:
            batches.pop()
        return batches

    def _grouped_by_length(self, epoch: int) -> list[list[int]]:
        """Within each megabatch of a random order, sort by length and cut into batches; then shuffle
        the batches and put the one holding the longest sample first (an out-of-memory shows at step 1)."""
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(self.num_samples)
        span = self.batch_size * MEGABATCH
        groups = [order[i : i + span] for i in range(0, len(order), span)]
        if not groups:
            return []
        batches = self._cut(np.concatenate([g[np.argsort(-self.lengths[g], kind="stable")] for g in groups]))
        batches = [batches[i] for i in rng.permutation(len(batches))]
        if batches:
            longest = max(range(len(batches)), key=lambda b: self.lengths[batches[b]].max())
            batches.insert(0, batches.pop(longest))
        return batches

    def __iter__(self) -> Iterator[list[int]]:
        # The sampler counts its own epochs: a pass that starts after the last one was fully
        # consumed starts the next epoch. (Lightning's epoch number is not used: after resuming
        # from a checkpoint taken at an epoch's end it skips one.) This runs on the first batch
        # requested, not when an iterator is merely created.
        new_pass, first, end = pass_span(self.consumed, self.all_batches(), self.step_batches)
        if new_pass:
            self.epoch, self.consumed = self.epoch + 1, 0
        epoch, self.pass_first = self.epoch, first
        # This rank's batches are first + rank, first + rank + world, ...
        for b in range(first + self.rank, end, self.world):
            yield self.batch(epoch, b)

    def __len__(self) -> int:
        """Batches per epoch on this rank (the full epoch: Lightning counts resumed batches itself)."""
        return self.num_batches() // self.world

    def advance(self) -> None:
        """One batch was trained on by every rank."""
        self.consumed += self.world

    def pass_remaining(self) -> int:
        """Batches this rank has left in the pass its next iteration continues (0: a new pass starts)."""
        return rank_batches_left(self.consumed, self.all_batches(), self.step_batches, self.world)

    def _step_start(self) -> int:
        """The first global batch of the optimizer step the next batch trained belongs to: the
        pass's steps run from where it started, in whole steps."""
        size = self.step_batches
        return self.pass_first + (self.consumed - self.pass_first) // size * size

    def step_key(self) -> tuple:
        """Which step current_step would give, without building it (asked at every micro batch)."""
        return (self.epoch, self._step_start())

    def current_step(self) -> list[list[int]]:
        """Every rank's micro batches (sample indices) of the optimizer step the next batch trained
        belongs to."""
        start = self._step_start()
        return [self.batch(self.epoch, b) for b in range(start, start + self.step_batches)]

    def resized_position(self, consumed: int, saved_batch_size: int) -> int:
        """The position in this run's batches of one saved in batches of another size: an epoch's
        order is a permutation of the samples whatever the batch size, so the run continues at the
        first sample not trained on, or (when that falls inside a batch) at the batch holding it,
        training the samples before it in that batch again."""
        samples = consumed * saved_batch_size
        position, again = divmod(samples, self.batch_size)
        log.info(
            "data position: %d samples of epoch %d trained in batches of %d; continuing at batch %d in batches of %d%s",
            samples, self.epoch, saved_batch_size, position, self.batch_size,
            f" (the {again} sample(s) before sample {samples} in that batch are trained again)" if again else "",
        )
        return position

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "consumed_batches": self.consumed, "num_samples": self.num_samples, "batch_size": self.batch_size, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if "sources" in state:  # saved by a mixture's MixtureBatchSampler (data.sources)
            log.warning("the checkpoint's data position is a mixture's (%s); this run reads one source: starting from its first batch", ", ".join(state["sources"]))
            return
        same_data = (state["num_samples"], state["seed"]) == (self.num_samples, self.seed)
        self.epoch = state["epoch"]
        if same_data and state["batch_size"] != self.batch_size and self.lengths is None:
            self.consumed = self.resized_position(state["consumed_batches"], state["batch_size"])
            return
        if not same_data or state["batch_size"] != self.batch_size:
            why = "length grouping orders batches by their size" if same_data else "other data"
            log.warning(
                "the checkpoint's data position is for %d samples in batches of %d (seed %d); this run has %d in batches of %d "
                "(seed %d): starting epoch %d from its first batch (%s)",
                state["num_samples"], state["batch_size"], state["seed"], self.num_samples, self.batch_size, self.seed, self.epoch, why,
            )
            self.consumed = 0
            return
        self.consumed = state["consumed_batches"]

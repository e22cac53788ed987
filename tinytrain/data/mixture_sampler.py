"""The batch sampler of a weighted mixture (data.sources): which source each training sample comes
from, and which of that source's items it is, as a pure function of the seed and the position.

Every sample is drawn from source k with probability p_k = weight_k / sum(weights). With g the
global sample number (batch j holds samples j*B .. j*B + B - 1):

  source(g)  entry g % BLOCK of the draws of block g // BLOCK (a numpy Generator seeded [seed, block])
  n_k        how many samples before g came from source k: the source's position
  item(g)    entry n_k % N_k of source k's shuffle for pass n_k // N_k (seeded [seed, crc32(name), pass])

With data stages (data.stages) the weights change at named steps: sample g is drawn with the
weights of the stage its optimizer step falls in (step = g // samples per step), from the same
uniform number (the block's draws are uniforms mapped through the stage's cumulative weights,
which is how numpy's choice draws), so the stream stays a pure function of seed, position and
stages, and one stage draws exactly what the weights alone did before stages existed.

so a source is read in a shuffled order, one whole pass before the next (data.exhaustion decides
whether a second pass is allowed; callbacks/mixture_exhaustion.py stops the run otherwise). Every
rank computes the same stream and trains the global batches j = rank (mod world), as
ResumableBatchSampler does.

Memory does not grow with the corpus: a source's shuffle for a pass is written once and mapped
(sample_index.EpochOrders under the folder the data module names, beside the source's store), and
the stream is computed a chunk of CHUNK samples at a time as batches are drawn, each source's
position carried from the chunk before. The position saved in checkpoints is (g, n_k for every source, by name);
a resumed run continues each source from its saved position, so nothing is repeated or skipped per
source, and with the same weights and seed the stream is exactly the uninterrupted one. With other
weights it continues each source where it was and draws by the new weights from there.
"""

from __future__ import annotations

import logging
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from torch.utils.data import Sampler

from tinytrain.data.sample_index import EpochOrders
from tinytrain.data.sampler import pass_span, rank_batches_left

log = logging.getLogger(__name__)

BLOCK = 1 << 16  # source draws are generated in blocks of this many samples, each from its own seed
CHUNK = BLOCK  # samples whose items are computed at once when iterating


def cumulative(p: np.ndarray) -> np.ndarray:
    """The cumulative weights numpy's Generator.choice maps uniforms through (last entry exactly 1)."""
    cdf = np.cumsum(p)
    return cdf / cdf[-1]


class MixtureBatchSampler(Sampler[list[int]]):
    """Batches of indices into the concatenation of the sources' datasets (source k's items start
    at offsets[k])."""

    def __init__(
        self,
        names: Sequence[str],
        sizes: Sequence[int],
        weights: Sequence[float],
        batch_size: int,
        seed: int,
        stages: Sequence[tuple[int | None, Sequence[float]]] = (),
        samples_per_step: int = 0,
        order_folders: Sequence[Path | None] = (),
    ):
        """`stages`: (until_step, weights per source) in order (data.stages), the steps after the last
        one drawn by `weights`; `samples_per_step`: the global batch in sequences (steps -> samples);
        `order_folders`: where each source's pass orders are written and mapped (None, or none
        given: computed in memory)."""
        if any(n < 1 for n in sizes):
            raise ValueError(f"every mixture source needs at least one item: {dict(zip(names, sizes))}")
        self.names = list(names)
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.sizes)[:-1]])
        w = np.asarray(weights, dtype=np.float64)
        self.weights = w / w.sum()
        self.stages = [(until, np.asarray(sw, dtype=np.float64) / float(np.sum(sw))) for until, sw in stages]
        self.samples_per_step = samples_per_step
        # (first sample after it or None, cumulative weights) of each phase of the stream, in order.
        phases = [(None if until is None else until * samples_per_step, sw) for until, sw in self.stages]
        if not phases or phases[-1][0] is not None:
            phases.append((None, self.weights))
        self._phases = [(end, cumulative(p)) for end, p in phases]
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0
        self.consumed = 0  # global batches of this epoch already trained on
        self.rank, self.world = 0, 1
        # Micro batches per optimizer step on each rank: an epoch is whole steps, as
        # ResumableBatchSampler's (callbacks/data_position.py sets it from the trainer).
        self.accumulation = 1
        self.pass_first = 0  # where this epoch's batches started (its steps are counted from there)
        # Where the stream is known from: sample number and each source's position there (a fresh
        # start, or the checkpoint a resumed run continues). Counts further on are derived from it.
        # Two cursors move on from there: the training step's (exhaustion checks, checkpoints) and
        # the iterator's, which runs ahead of it by the batches being prefetched.
        self._origin = (0, np.zeros(len(self.names), dtype=np.int64))
        self._known = {"step": self._origin, "iter": self._origin}
        self._blocks: dict[int, np.ndarray] = {}
        folders = list(order_folders) or [None] * len(self.names)
        self._orders = [EpochOrders(folder, int(size), seed, (zlib.crc32(name.encode()),)) for folder, size, name in zip(folders, self.sizes, self.names)]

    def set_shard(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    # -- the stream -----------------------------------------------------------------------------

    @property
    def step_batches(self) -> int:
        """Global micro batches per optimizer step: a round of every rank, `accumulation` times."""
        return self.world * self.accumulation

    @property
    def epoch_batches(self) -> int:
        """Global batches per epoch (a nominal epoch, as many samples as all sources hold; the
        mixture itself has no end), whole optimizer steps so every rank gets as many and no step's
        accumulation runs into the next epoch."""
        per_epoch = int(self.sizes.sum()) // self.batch_size
        return max(self.step_batches, per_epoch - per_epoch % self.step_batches)

    def draws(self, start: int, stop: int) -> np.ndarray:
        """The source of each global sample start .. stop - 1."""
        if stop <= start:
            return np.zeros(0, dtype=np.int64)
        parts = []
        for block in range(start // BLOCK, (stop - 1) // BLOCK + 1):
            lo, hi = max(start, block * BLOCK) - block * BLOCK, min(stop, (block + 1) * BLOCK) - block * BLOCK
            parts.append(self._block(block)[lo:hi])
        return np.concatenate(parts)

    def _block(self, block: int) -> np.ndarray:
        # The last two blocks are kept: each step's exhaustion check and checkpoint read the same one,
        # and the iterator, a little ahead, reads the same or the next.
        if block not in self._blocks:
            uniform = np.random.default_rng([self.seed, block]).random(BLOCK)
            sample = block * BLOCK + np.arange(BLOCK)
            drawn = np.empty(BLOCK, dtype=np.int64)
            start = 0
            for end, cdf in self._phases:
                at = (sample >= start) & (sample < end) if end is not None else sample >= start
                drawn[at] = cdf.searchsorted(uniform[at], side="right")
                start = end if end is not None else start
            self._blocks = {**dict(list(self._blocks.items())[-1:]), block: drawn}  # the one before, and this
        return self._blocks[block]

    def positions_at(self, sample: int, cursor: str = "step") -> np.ndarray:
        """Each source's position (samples drawn from it so far) before global sample `sample`."""
        start, counts = max((k for k in (self._origin, *self._known.values()) if k[0] <= sample), key=lambda k: k[0], default=self._origin)
        if sample < start:
            raise ValueError(f"sample {sample} is before this run's start of the stream ({start})")
        counts = counts.copy()
        for lo in range(start, sample, BLOCK):  # a block at a time: no array as long as the stream
            counts += np.bincount(self.draws(lo, min(sample, lo + BLOCK)), minlength=len(self.names))
        self._known[cursor] = (sample, counts)
        return counts

    def items(self, start: int, stop: int, cursor: str = "iter") -> np.ndarray:
        """Dataset indices of global samples start .. stop - 1 (`cursor`: which reader's known
        position the count moves to)."""
        source = self.draws(start, stop)
        positions = self.positions_at(start, cursor)
        out = np.empty(stop - start, dtype=np.int64)
        for k, name in enumerate(self.names):
            mine = np.flatnonzero(source == k)
            ordinal = positions[k] + np.arange(len(mine))
            passes, within = np.divmod(ordinal, self.sizes[k])
            for p in np.unique(passes):
                order = self._orders[k](int(p))  # np.random.default_rng([seed, crc32(name), pass]).permutation(N_k)
                at = passes == p
                out[mine[at]] = self.offsets[k] + order[within[at]]
        return out

    # -- the Sampler protocol (as ResumableBatchSampler) ----------------------------------------

    def __iter__(self) -> Iterator[list[int]]:
        # A pass that starts after the last one was fully consumed starts the next epoch (see
        # ResumableBatchSampler: this runs on the first batch requested).
        new_pass, first, end = pass_span(self.consumed, self.epoch_batches, self.step_batches)
        if new_pass:
            self.epoch, self.consumed = self.epoch + 1, 0
        self.pass_first = first
        first, last = self.epoch * self.epoch_batches + first, self.epoch * self.epoch_batches + end
        b = self.batch_size
        per_chunk = max(1, CHUNK // b)  # global batches computed at once
        chunk = (0, 0, np.zeros(0, dtype=np.int64))
        for j in range(first + self.rank, last, self.world):
            lo, hi, indices = chunk
            if j >= hi:
                lo, hi = j, min(last, j + per_chunk)
                chunk = (lo, hi, self.items(lo * b, hi * b))
                indices = chunk[2]
            yield indices[(j - lo) * b : (j - lo + 1) * b].tolist()

    def __len__(self) -> int:
        return self.epoch_batches // self.world

    def advance(self) -> None:
        """One batch was trained on by every rank."""
        self.consumed += self.world

    def pass_remaining(self) -> int:
        """Batches this rank has left in the pass its next iteration continues (0: a new pass starts)."""
        return rank_batches_left(self.consumed, self.epoch_batches, self.step_batches, self.world)

    def _step_start(self) -> int:
        """The stream's global batch where the optimizer step the next batch trained belongs to began."""
        size = self.step_batches
        return self.epoch * self.epoch_batches + self.pass_first + (self.consumed - self.pass_first) // size * size

    def step_key(self) -> tuple:
        """Which step current_step would give, without building it (asked at every micro batch)."""
        return (self._step_start(),)

    def current_step(self) -> list[list[int]]:
        """Every rank's micro batches (dataset indices) of the optimizer step the next batch trained
        belongs to, as ResumableBatchSampler.current_step."""
        size, b = self.step_batches, self.batch_size
        start = self._step_start()
        indices = self.items(start * b, (start + size) * b, cursor="step_tokens")
        return [indices[i * b : (i + 1) * b].tolist() for i in range(size)]

    @property
    def samples_consumed(self) -> int:
        return (self.epoch * self.epoch_batches + self.consumed) * self.batch_size

    def first_exhausted(self, batches: int) -> int | None:
        """The first source (index) whose first pass the next `batches` global batches would go
        beyond, or None."""
        now = self.samples_consumed
        after = self.positions_at(now) + np.bincount(self.draws(now, now + batches * self.batch_size), minlength=len(self.names))
        over = np.flatnonzero(after > self.sizes)
        return int(over[0]) if over.size else None

    # -- checkpoints ----------------------------------------------------------------------------

    def state_dict(self) -> dict:
        g = self.samples_consumed
        positions = self.positions_at(g)
        return {
            "epoch": self.epoch,
            "consumed_batches": self.consumed,
            "samples": g,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "stages": [{"until_step": until, "weights": dict(zip(self.names, w.tolist()))} for until, w in self.stages],
            "sources": {
                name: {"position": int(n), "pass": int(n // size), "in_pass": int(n % size), "items": int(size), "weight": float(w)}
                for name, n, size, w in zip(self.names, positions, self.sizes, self.weights)
            },
        }

    def load_state_dict(self, state: dict) -> None:
        if "sources" not in state:
            log.warning("the checkpoint's data position is not a mixture's (it trained on one source): every mixture source starts from its first item")
            return
        saved = state["sources"]
        positions = np.zeros(len(self.names), dtype=np.int64)
        for k, name in enumerate(self.names):
            if name not in saved:
                log.warning("mixture source %r is not in the checkpoint: it starts from its first item", name)
            elif saved[name]["items"] != self.sizes[k]:
                log.warning("mixture source %r had %d items when the checkpoint was saved and has %d now: its position %d is kept, its order is not", name, saved[name]["items"], self.sizes[k], saved[name]["position"])
                positions[k] = saved[name]["position"]
            else:
                positions[k] = saved[name]["position"]
        dropped = sorted(set(saved) - set(self.names))
        if dropped:
            log.warning("mixture sources in the checkpoint but not in this run: %s", ", ".join(dropped))
        if (state["batch_size"], state["seed"]) != (self.batch_size, self.seed):
            log.warning("the checkpoint's mixture was drawn in batches of %d with seed %d, this run's are %d and %d: each source continues from its position", state["batch_size"], state["seed"], self.batch_size, self.seed)
        weights = {name: s["weight"] for name, s in saved.items()}
        if weights != dict(zip(self.names, self.weights.tolist())):
            log.info("mixture weights changed from %s to %s: each source continues from its position", weights, dict(zip(self.names, self.weights.round(4).tolist())))
        stages = [{"until_step": until, "weights": dict(zip(self.names, w.tolist()))} for until, w in self.stages]
        if state.get("stages", []) != stages:
            step = state["samples"] // self.samples_per_step if self.samples_per_step else None
            log.warning("data stages changed since the checkpoint (step %s): %s -> %s; the steps from here on are drawn by the new stages", step, state.get("stages", []), stages)
        batches, again = divmod(state["samples"], self.batch_size)
        if again:
            # Saved in batches of another size: continue at the batch holding the first sample not
            # trained on, training the ones before it in that batch again (as ResumableBatchSampler
            # does), each source's position taken back over them.
            start = batches * self.batch_size
            positions = np.maximum(positions - np.bincount(self.draws(start, state["samples"]), minlength=len(self.names)), 0)
            log.info("mixture position: %d samples trained in batches of %d; continuing at sample %d in batches of %d (the %d sample(s) before sample %d are trained again)", state["samples"], state["batch_size"], start, self.batch_size, again, state["samples"])
        self.epoch, self.consumed = divmod(batches, self.epoch_batches)
        self._origin = (batches * self.batch_size, positions)
        self._known = {"step": self._origin, "iter": self._origin}

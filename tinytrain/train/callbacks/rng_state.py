"""Puts every rank's RNG states (torch, CUDA, numpy, Python) into checkpoints and restores them on
resume, so anything random after the resume point (dropout, noise) draws what it would have drawn.

Lightning saves no RNG state. The states are gathered from all ranks at save time (every rank
builds the checkpoint; rank 0 writes it) and each rank takes its own back. They are applied when
training starts, after model building and checkpoint loading, which draw from the same
generators. The data order does not depend on them (data/sampler.py has its own seeded order,
and the DataLoaders their own generator).

Resumed on another number of ranks (a data-parallel or tp change), the original run's draws
cannot all come back: its ranks drew for batches that are now split differently. Each rank that
existed takes its own states back (rank 0 continues exactly as it would have); a rank the
checkpoint did not have is seeded from (`seed`, the resumed step, its rank), so resuming the same
checkpoint on the same layout twice draws the same, and no two new ranks draw alike. The states
of ranks that no longer exist are dropped. The log says which ranks did what.
"""

from __future__ import annotations

import logging
import random

import lightning.pytorch as pl
import numpy as np
import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


def rng_states() -> dict:
    # Plain types and tensors only: Lightning loads checkpoints with torch.load(weights_only=True).
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    states = {"torch": torch.get_rng_state(), "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss], "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state()  # this rank's device
    return states


def set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    name, keys, pos, has_gauss, gauss = states["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"])


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def seed_new_rank(seed: int, step: int, rank: int) -> None:
    """A rank the checkpoint had no states for: every generator seeded from (seed, step, rank)."""
    derived = int(np.random.SeedSequence([seed, step, rank]).generate_state(1)[0])
    torch.manual_seed(derived)  # also every CUDA device's
    np.random.seed(derived)
    random.seed(derived)


class RNGState(pl.Callback):
    def __init__(self, seed: int):
        self.seed = seed  # run.seed: where a rank the checkpoint did not have starts its draws
        self.saved: list | None = None  # every saved rank's states, applied when training starts

    def state_dict(self) -> dict:
        rank, world = _world()
        mine = rng_states()
        if world == 1:
            return {"ranks": [mine]}
        gathered: list = [None] * world
        dist.all_gather_object(gathered, mine)  # every rank is inside save_checkpoint here
        return {"ranks": gathered}

    def load_state_dict(self, state_dict: dict) -> None:
        self.saved = state_dict["ranks"]

    def on_train_start(self, trainer, pl_module):
        if self.saved is None:
            return
        rank, world = _world()
        saved, self.saved = self.saved, None
        if rank < len(saved):
            set_rng_states(saved[rank])
        else:
            seed_new_rank(self.seed, trainer.global_step, rank)
        if len(saved) != world and rank == 0:
            kept = f"restored for {ranks(0, min(len(saved), world))}"
            new = f", new {ranks(len(saved), world)} seeded from (seed {self.seed}, step {trainer.global_step}, rank)" if world > len(saved) else ""
            log.info("RNG        the checkpoint has the RNG states of %d ranks, this run has %d: %s%s", len(saved), world, kept, new)


def ranks(first: int, end: int) -> str:
    return f"rank {first}" if end - first == 1 else f"ranks {first}-{end - 1}"

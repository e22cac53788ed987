"""Puts every rank's RNG states (torch, CUDA, numpy, Python) into checkpoints and restores them on
resume, so anything random after the resume point (dropout, noise) draws what it would have drawn.

Lightning saves no RNG state. The states are gathered from all ranks at save time (every rank
builds the checkpoint; rank 0 writes it) and each rank takes its own back. They are applied when
training starts, after model building and checkpoint loading, which draw from the same
generators. The data order does not depend on them (data/sampler.py has its own seeded order,
and the DataLoaders their own generator).
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


class RNGState(pl.Callback):
    def __init__(self):
        self.pending: dict | None = None

    def state_dict(self) -> dict:
        rank, world = _world()
        mine = rng_states()
        if world == 1:
            return {"ranks": [mine]}
        gathered: list = [None] * world
        dist.all_gather_object(gathered, mine)  # every rank is inside save_checkpoint here
        return {"ranks": gathered}

    def load_state_dict(self, state_dict: dict) -> None:
        rank, world = _world()
        saved = state_dict["ranks"]
        if len(saved) != world:
            log.warning("the checkpoint has RNG states of %d ranks, this run has %d: random draws after the resume will differ from the original run's", len(saved), world)
            return
        self.pending = saved[rank]

    def on_train_start(self, trainer, pl_module):
        if self.pending is not None:
            set_rng_states(self.pending)
            self.pending = None

"""RNG states (torch, numpy, Python) saved in a checkpoint come back on resume, through the
weights_only loading Lightning uses; on another number of ranks, each rank that existed takes its
own back and a new rank is seeded deterministically from (seed, step, rank)."""

import logging
import random
from types import SimpleNamespace

import numpy as np
import torch

from tinytrain.train.callbacks import rng_state
from tinytrain.train.callbacks.rng_state import RNGState, rng_states


def draws():
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random()


def at_step(step: int):
    return SimpleNamespace(global_step=step)


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    draws()
    torch.save({"callbacks": {"RNGState": RNGState(1234).state_dict()}}, tmp_path / "step.ckpt")
    expected = draws()
    draws()  # the run went on, or a new process seeded itself again
    torch.manual_seed(1), np.random.seed(2), random.seed(3)

    resumed = RNGState(1234)
    resumed.load_state_dict(torch.load(tmp_path / "step.ckpt", weights_only=True)["callbacks"]["RNGState"])
    assert draws() != expected  # nothing applied before training starts (model building draws first)
    resumed.on_train_start(at_step(4), None)
    assert draws() == expected


def resumed_draws(saved: list, rank: int, world: int, monkeypatch, seed: int = 1234, step: int = 4):
    """What `rank` of a `world`-rank run resumed from `saved` draws first."""
    monkeypatch.setattr(rng_state, "_world", lambda: (rank, world))
    cb = RNGState(seed)
    cb.load_state_dict({"ranks": saved})
    random.seed(99), np.random.seed(99), torch.manual_seed(99)  # the process's own seeding, to be replaced
    cb.on_train_start(at_step(step), None)
    return draws()


def test_another_world_size_keeps_the_ranks_that_existed_and_seeds_new_ones_from_seed_step_rank(monkeypatch, caplog):
    saved, expected = [], []
    for r in range(2):  # a 2-rank run's states at its save, and what each rank drew next
        torch.manual_seed(10 + r), np.random.seed(20 + r), random.seed(30 + r)
        saved.append(rng_states())
        expected.append(draws())

    caplog.set_level(logging.INFO, logger=rng_state.__name__)
    grown = [resumed_draws(saved, r, 4, monkeypatch) for r in range(4)]  # 2 -> 4 ranks
    assert grown[:2] == expected  # ranks 0 and 1 continue their own draws
    assert grown[2] != grown[3] and all(g not in expected for g in grown[2:])
    assert "RNG states of 2 ranks, this run has 4: restored for ranks 0-1, new ranks 2-3 seeded from (seed 1234, step 4, rank)" in caplog.text
    # Deterministic: the same checkpoint resumed on the same layout again draws the same; another
    # step or seed draws otherwise.
    assert resumed_draws(saved, 3, 4, monkeypatch) == grown[3]
    assert resumed_draws(saved, 3, 4, monkeypatch, step=6) != grown[3]
    assert resumed_draws(saved, 3, 4, monkeypatch, seed=1) != grown[3]

    assert resumed_draws(saved, 0, 1, monkeypatch) == expected[0]  # 2 -> 1: rank 1's states dropped
    assert "RNG states of 2 ranks, this run has 1: restored for rank 0\n" in caplog.text

"""RNG states (torch, numpy, Python) saved in a checkpoint come back on resume, through the
weights_only loading Lightning uses."""

import random

import numpy as np
import torch

from tinytrain.train.callbacks.rng_state import RNGState


def draws():
    return torch.rand(3).tolist(), np.random.rand(3).tolist(), random.random()


def test_rng_states_round_trip_through_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    draws()
    torch.save({"callbacks": {"RNGState": RNGState().state_dict()}}, tmp_path / "step.ckpt")
    expected = draws()
    draws()  # the run went on, or a new process seeded itself again
    torch.manual_seed(1), np.random.seed(2), random.seed(3)

    resumed = RNGState()
    resumed.load_state_dict(torch.load(tmp_path / "step.ckpt", weights_only=True)["callbacks"]["RNGState"])
    assert draws() != expected  # nothing applied before training starts (model building draws first)
    resumed.on_train_start(None, None)
    assert draws() == expected


def test_states_of_another_world_size_are_left_alone(caplog):
    state = RNGState().state_dict()
    cb = RNGState()
    cb.load_state_dict({"ranks": state["ranks"] * 2})
    assert cb.pending is None and "RNG states of 2 ranks, this run has 1" in caplog.text

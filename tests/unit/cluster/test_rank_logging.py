"""Rank 0 logs everything; other ranks only warnings and errors, each line carrying its rank."""

import io
import logging

import pytest

from tinytrain.cluster import rank_logging


@pytest.fixture
def root_handler():
    """A handler on the root logger, as Hydra's job logging installs one; removed afterwards."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(message)s"))
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    yield stream
    root.removeHandler(handler)
    root.setLevel(level)
    logging.captureWarnings(False)


LAUNCHED = {"WORLD_SIZE": "8", "SLURM_NTASKS": "8"}


@pytest.mark.parametrize(
    ("env", "rank"),
    [
        ({}, 0),
        ({"LOCAL_RANK": "1", **LAUNCHED}, 1),
        ({"SLURM_PROCID": "3", "LOCAL_RANK": "1", **LAUNCHED}, 3),
        ({"RANK": "5", "SLURM_PROCID": "3", **LAUNCHED}, 5),
        # Strays in a user's shell, no launcher beside them: Lightning trains as rank 0, and so must tinytrain.
        ({"RANK": "1"}, 0),
        ({"LOCAL_RANK": "2"}, 0),
        ({"SLURM_PROCID": "1", "WORLD_SIZE": "2"}, 0),
        ({"LOCAL_RANK": ""}, 0),
        # Inside `srun --pty bash`: Lightning's launcher starts the ranks, each inheriting the shell's SLURM_PROCID=0.
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "bash", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}, 1),
    ],
)
def test_process_rank(monkeypatch, env, rank):
    for var in ("RANK", "SLURM_PROCID", "LOCAL_RANK", "WORLD_SIZE", "SLURM_NTASKS", "SLURM_JOB_NAME"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    assert rank_logging.process_rank() == rank


def test_a_rank_that_is_no_number_is_named(monkeypatch):
    from tinytrain.errors import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "")  # export LOCAL_RANK=$SLURM_LOCALID outside srun
    with pytest.raises(ConfigError, match="LOCAL_RANK='': is not a rank"):
        rank_logging.process_rank()


def test_rank_zero_keeps_every_line(root_handler):
    rank_logging.configure(0)
    logging.getLogger("tinytrain.test").info("step 1")
    assert root_handler.getvalue() == "step 1\n"


def test_other_ranks_keep_warnings_with_their_rank(root_handler):
    rank_logging.configure(2)
    log = logging.getLogger("tinytrain.test")
    log.info("step 1")
    log.warning("disk almost full")
    lines = root_handler.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("[rank 2] ") and lines[0].endswith("disk almost full")

"""Slurm: a run name stable across requeues from the job id, array tasks named as scontrol wants
them, and Lightning's cluster environment without its own requeue handler."""

import re

import pytest

from tests.conftest import compose
from tinytrain import slurm

SLURM_VARS = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_JOB_NAME", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE")


@pytest.fixture
def no_slurm(monkeypatch):
    for var in SLURM_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_job_ids():
    assert slurm.job_id({}) is None
    assert slurm.job_id({"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "pretrain"}) == "4242"
    array_task = {"SLURM_JOB_ID": "4250", "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "8"}
    assert slurm.job_id(array_task) == "4242_8"
    assert slurm.run_name(array_task) == "slurm-4242_8"
    # salloc / srun --pty: every command typed there is a run of its own
    assert slurm.job_id({"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "interactive"}) is None


def test_run_name_comes_from_the_job(no_slurm):
    no_slurm.setenv("SLURM_JOB_ID", "4242")
    assert compose().run.name == "slurm-4242"
    no_slurm.setenv("SLURM_ARRAY_JOB_ID", "4240")
    no_slurm.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert compose().run.name == "slurm-4240_3"
    assert compose(["run.name=mine"]).run.name == "mine"


def test_run_name_outside_slurm_is_the_start_time(no_slurm):
    cfg = compose()
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", cfg.run.name)
    assert cfg.run.name == cfg.run.name  # one value per config, however often it is read


def test_lightning_requeue_handler_is_off_under_srun(no_slurm):
    assert slurm.cluster_plugins() == []
    no_slurm.setenv("SLURM_NTASKS", "2")
    no_slurm.setenv("SLURM_NTASKS_PER_NODE", "2")
    no_slurm.setenv("SLURM_JOB_ID", "4242")
    (env,) = slurm.cluster_plugins()
    assert type(env).__name__ == "SLURMEnvironment" and env.auto_requeue is False


def test_requeue_reports_a_missing_scontrol(no_slurm):
    no_slurm.setenv("PATH", "/nonexistent")
    ok, what = slurm.requeue("4242")
    assert not ok and "scontrol requeue 4242 failed" in what

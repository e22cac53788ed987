"""Preemption on a real Slurm: a job sent SIGUSR1 mid-run checkpoints, is requeued, resumes
(SLURM_RESTART_COUNT=1) and finishes with the per-step losses of an uninterrupted run."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.integration.slurm_jobs import CPU_TASKS, assert_resumed_on_the_same_trajectory, requeue_mid_run

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SCRIPT = REPO / "slurm" / "single_node.sbatch"


def test_sigusr1_checkpoints_requeues_and_resumes_on_the_same_trajectory(slurm, tmp_path):
    assert_resumed_on_the_same_trajectory(requeue_mid_run(slurm, SCRIPT, [*CPU_TASKS, "--gpus-per-node=2"], [], tmp_path))

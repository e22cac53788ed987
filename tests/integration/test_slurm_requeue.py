"""Preemption on a real Slurm: a job sent SIGUSR1 mid-run checkpoints, is requeued, resumes
(SLURM_RESTART_COUNT=1) and finishes with the per-step losses of an uninterrupted run. A job with a
rank that hangs is named by the watchdog, requeued by it, and finishes from its last checkpoint."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.integration.slurm_jobs import CPU_TASKS, SHORT_RUN, assert_resumed_on_the_same_trajectory, finish, job_env, requeue_mid_run

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SCRIPT = REPO / "slurm" / "single_node.sbatch"


def test_sigusr1_checkpoints_requeues_and_resumes_on_the_same_trajectory(slurm, tmp_path):
    assert_resumed_on_the_same_trajectory(requeue_mid_run(slurm, SCRIPT, [*CPU_TASKS, "--gpus-per-node=2"], [], tmp_path))


# The shipped scripts run `python -m tinytrain`; this one runs the test hooks' entry point the same way.
HANG_SCRIPT = """#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
echo "start ${SLURM_RESTART_COUNT:-0} of job $SLURM_JOB_ID"
srun python -m tests.integration.instrumented_cli cluster=slurm "$@"
"""


@pytest.mark.timeout(500)
def test_a_hung_rank_is_named_and_the_job_requeues_itself_and_finishes_from_its_checkpoint(slurm, tmp_path):
    """Rank 1 of 2 sleeps 10 minutes at the start of step 4 (its first start only): within the
    5 s limit the watchdog writes hang_report.txt naming rank 1, `scontrol requeue`s the job and the
    ranks exit 76; the second start resumes from step 2's checkpoint and completes."""
    script = tmp_path / "hang.sbatch"
    script.write_text(HANG_SCRIPT)
    options = [f"--output={tmp_path}/%x-%j.out", "--nodes=1", *CPU_TASKS]
    args = [*SHORT_RUN, "trainer.max_steps=8", "trainer.checkpoint_every_n_steps=2", "trainer.val_every_n_steps=1000", "parallel=ddp", "cluster.nodes=1", "cluster.devices=2",
            "cluster.hang_timeout_s=5", "cluster.startup_timeout_s=120", "cluster.slow_phase_timeout_s=60", f"run.root={tmp_path}"]
    job_id = slurm.sbatch(script, options, args, env={**job_env(), "TT_TEST_STALL_RANK": "1:4:600"}, cwd=REPO)
    done = finish(slurm, job_id, tmp_path, timeout=400)
    assert done.job.restarts == 1, done.log[-4000:]
    first, _, second = done.log.partition("start 1 of job")
    assert "tinytrain: hang: no rank made progress for 5 s (phase train); did not arrive: rank 1" in first, first[-4000:]
    assert f"tinytrain: Slurm job {job_id} requeued; the requeued job resumes from the newest checkpoint" in first, first[-4000:]
    assert "did not arrive: rank 1" in (done.run_dir / "hang_report.txt").read_text()
    assert "resuming from checkpoints/step0000002.ckpt (step 2)" in second, second[-4000:]
    assert sorted(done.losses()) == list(range(8))

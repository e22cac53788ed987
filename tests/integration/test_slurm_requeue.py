"""Preemption on a real Slurm: a job sent SIGUSR1 mid-run checkpoints, is requeued, resumes
(SLURM_RESTART_COUNT=1) and finishes with the per-step losses of an uninterrupted run."""

from __future__ import annotations

import re
import time

import pytest

from tests.conftest import REPO
from tests.integration.slurm_jobs import CPU_TASKS, SHORT_RUN, finish, submit
from tests.slurm_cluster import FINISHED

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SCRIPT = REPO / "slurm" / "single_node.sbatch"
# The signal goes out when the first periodic checkpoint (step 5) appears: 55 more steps leave it
# time to arrive mid-run on a fast machine too.
STEPS = 60
RUN = [*SHORT_RUN, f"trainer.max_steps={STEPS}", "trainer.checkpoint_every_n_steps=5", "trainer.val_every_n_steps=10"]


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.2)


def test_sigusr1_checkpoints_requeues_and_resumes_on_the_same_trajectory(slurm, tmp_path):
    interrupted, reference = tmp_path / "interrupted", tmp_path / "reference"
    interrupted.mkdir(), reference.mkdir()
    job_id = submit(slurm, SCRIPT, CPU_TASKS, RUN, interrupted)
    checkpoints = interrupted / f"slurm-{job_id}" / "checkpoints"  # run.name from the job id, kept across the requeue
    wait_for(lambda: any(checkpoints.glob("step*.ckpt")) or slurm.job(job_id).state in FINISHED, 180, f"periodic checkpoint in {checkpoints}")
    assert slurm.job(job_id).state == "RUNNING", f"job {job_id} ended before its first checkpoint: {slurm.job(job_id).fields.get('StdOut')}"
    # To srun's tasks (python), as --signal=USR1@N would; the batch shell does not get it.
    slurm.run(["scancel", "--signal=USR1", str(job_id)])
    reference_id = submit(slurm, SCRIPT, CPU_TASKS, RUN, reference)

    # A requeued job is PENDING, then RUNNING again, until its second start ends; one the signal
    # missed ends at once.
    resumed = finish(slurm, job_id, interrupted, timeout=400)
    assert resumed.job.restarts == 1, resumed.log[-4000:]
    first, _, second = resumed.log.partition("restart 1,")  # the script's banner per start
    assert "restart 0," in first and second, resumed.log[-4000:]
    uninterrupted = finish(slurm, reference_id, reference)

    # It resumed, from a checkpoint written after the signal came (after the first periodic one)...
    resumed_from = re.search(r"resuming from checkpoints/step\d+\.ckpt \(step (\d+)\)", second)
    assert resumed_from and int(resumed_from.group(1)) >= 5, second[-4000:]
    # ... and trained every step as the uninterrupted run did.
    losses, expected = resumed.losses(), uninterrupted.losses()
    assert sorted(losses) == sorted(expected) == list(range(STEPS)), f"steps logged: {sorted(losses)}"
    assert [losses[s] for s in range(STEPS)] == [expected[s] for s in range(STEPS)]

"""slurm/multi_node.sbatch on a real two-node Slurm (two slurmd on this machine): 2 nodes x 1 task
train over gloo in one run directory; SIGUSR1 to both tasks checkpoints, the job is requeued, both
nodes resume, and metrics.csv ends as an uninterrupted two-node run's."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.integration.slurm_jobs import assert_resumed_on_the_same_trajectory, requeue_mid_run

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SCRIPT = REPO / "slurm" / "multi_node.sbatch"
# The script's nodes and tasks made CPU-sized: one task of one core (and one of the fake GPUs) per
# node. parallel=ddp for its DeepSpeed, which needs CUDA.
TWO_NODES = ["--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=1", "--cpus-per-task=1"]


def launches(slurm, job_id: str) -> dict[str, int]:
    """Per node: how many times its slurmd launched the job's srun step (its log says so)."""
    logs = {node: (slurm.root / "log" / f"slurmd-{node}.log").read_text(errors="replace") for node in slurm.nodes}
    return {node: log.count(f"launch task StepId={job_id}.0 ") for node, log in logs.items()}


def test_two_nodes_train_in_one_run_directory_and_resume_together_after_sigusr1(slurm_two_nodes, tmp_path):
    requeued = requeue_mid_run(slurm_two_nodes, SCRIPT, TWO_NODES, ["parallel=ddp"], tmp_path)
    job_id = requeued.resumed.job.fields["JobId"]
    # Each start ran a task on each node, as one world of 2 with rank 0 at node1's address.
    assert launches(slurm_two_nodes, job_id) == {"node1": 2, "node2": 2}
    for restart in (0, 1):
        assert f"job {job_id} on node[1-2] (rank 0 at 127.0.0.1), restart {restart}," in requeued.resumed.log, requeued.resumed.log[-4000:]
    for start in (requeued.first, requeued.second):
        assert "cluster    slurm: 2 node(s) x 1 device(s) per node, from allocation of Slurm job" in start, start[-4000:]
        assert "world size 2 = tp 1 x dp 2" in start, start[-4000:]
    # One run directory for both nodes and both starts.
    assert [p.name for p in (tmp_path / "interrupted").iterdir() if p.is_dir()] == [f"slurm-{job_id}"]
    assert_resumed_on_the_same_trajectory(requeued)

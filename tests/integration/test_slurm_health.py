"""cluster.on_bad_node=exclude on a real two-node Slurm (two slurmd on this machine): mode=health
finds rank 1 (node2) slowed by the test hook, rank 0 adds node2 to the job's excluded nodes and
requeues it; the requeued job then waits for a second node it may not use."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO
from tests.integration.slurm_jobs import job_env, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SCRIPT = """#!/bin/bash
#SBATCH --requeue
#SBATCH --open-mode=append
set -euo pipefail
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_ADDR=$(scontrol show node -o "$first_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)
export MASTER_ADDR
srun python -m tests.integration.instrumented_cli cluster=slurm "$@"
"""


@pytest.mark.timeout(400)
def test_exclude_requeues_the_job_without_the_slow_node(slurm_two_nodes, tmp_path):
    script = tmp_path / "health.sbatch"
    script.write_text(SCRIPT)
    options = [f"--output={tmp_path}/%x-%j.out", "--nodes=2", "--ntasks-per-node=1", "--cpus-per-task=1"]
    args = ["mode=health", "cluster.nodes=2", "cluster.devices=1", "cluster.on_bad_node=exclude", "cluster.health_budget_s=4", f"run.root={tmp_path}"]
    job_id = slurm_two_nodes.sbatch(script, options, args, env={**job_env(), "TT_TEST_SLOW_RANK": "1:3"}, cwd=REPO)
    try:
        def requeued_without_node2():
            job = slurm_two_nodes.job(job_id)
            return job.fields.get("ExcNodeList") == "node2" and int(job.fields.get("Restarts", "0")) >= 1 and job.state == "PENDING"

        wait_for(requeued_without_node2, 300, "the job pending again, without node2")
        log = next(tmp_path.glob(f"*-{job_id}.out")).read_text(errors="replace")
        assert "health check: rank 1 on node2: matmul" in log, log[-4000:]
        assert f"Slurm job {job_id} requeued with --exclude=node2: the job runs again without node2 (exit 75)" in log, log[-4000:]
    finally:
        subprocess.run(["scancel", str(job_id)], env=slurm_two_nodes.env(), capture_output=True, timeout=30)

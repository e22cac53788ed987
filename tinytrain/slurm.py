"""What tinytrain needs from Slurm: the job's id (a run name stable across requeues), a requeue,
and Lightning's cluster environment without its own requeue handler."""

from __future__ import annotations

import logging
import os
import subprocess
from collections.abc import Mapping

log = logging.getLogger(__name__)


def interactive(env: Mapping[str, str]) -> bool:
    # Lightning's rule too: an allocation named bash/interactive (salloc, srun --pty) runs commands by hand.
    return env.get("SLURM_JOB_NAME") in ("bash", "interactive")


def job_id(env: Mapping[str, str] = os.environ) -> str | None:
    """`<array job>_<task>` for a task of an array job (what `scontrol requeue` takes), else the job
    id; None outside Slurm and in an interactive allocation (each command there is its own run)."""
    if interactive(env):
        return None
    if env.get("SLURM_ARRAY_JOB_ID") and env.get("SLURM_ARRAY_TASK_ID"):
        return f"{env['SLURM_ARRAY_JOB_ID']}_{env['SLURM_ARRAY_TASK_ID']}"
    return env.get("SLURM_JOB_ID") or None


def requeue(job: str) -> tuple[bool, str]:
    """`scontrol requeue <job>`: (worked, what happened). Slurm then ends this job's processes
    (SIGTERM, SIGKILL after KillWait) and starts the job again."""
    try:
        done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"scontrol requeue {job} failed: {e}"
    if done.returncode != 0:
        return False, f"scontrol requeue {job} failed (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
    return True, f"Slurm job {job} requeued"


def run_name(env: Mapping[str, str] = os.environ) -> str | None:
    """`slurm-<job>`: the same for every task of the job and again after a requeue."""
    job = job_id(env)
    return f"slurm-{job}" if job else None


def cluster_plugins() -> list:
    """Under Slurm: Lightning's SLURMEnvironment with auto_requeue off. Its requeue handler saves a
    checkpoint inside the signal handler, in the middle of a step; callbacks/preemption.py saves at
    the next step boundary instead."""
    if "SLURM_NTASKS" not in os.environ or interactive(os.environ):  # SLURMEnvironment.detect(), without its warning
        return []
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)]

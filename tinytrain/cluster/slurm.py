"""What tinytrain needs from Slurm: the job's id (a run name stable across requeues), a requeue,
Lightning's cluster environment without its own requeue handler, and the task this process runs as
(nodes, tasks per node) with what a config that disagrees with it would do.

Lightning's SLURMEnvironment takes ranks and the world size from the same variables whenever
SLURM_NTASKS is set (salloc shells, named `bash` or `interactive`, excepted), so a config whose
nodes x devices differ from the job's is caught here, before any data or weights are built.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from tinytrain.errors import Problem

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


@contextlib.contextmanager
def sigterm_ignored():
    """SIGTERM ignored inside the block (in the main thread; elsewhere it cannot be changed): a
    requeue sends it to every process of the job, the one asking included, which still has to
    say what the requeue did. Slurm's SIGKILL after KillWait ends it all the same."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGTERM, before)


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


def requeue_excluding(job: str, nodes: list[str]) -> tuple[bool, str]:
    """Requeue the job so that it runs again without `nodes`. Slurm changes a job's excluded nodes
    only while it is pending: `scontrol requeuehold` (pending, held), `scontrol update
    ExcNodeList` (as `sbatch --exclude` would), `scontrol release`. The requeue sends this process
    SIGTERM; it is ignored until the job is released."""
    listed = ",".join(nodes)
    steps = [["requeuehold", job], ["update", f"JobId={job}", f"ExcNodeList={listed}"], ["release", job]]
    with sigterm_ignored():
        for step in steps:
            try:
                done = subprocess.run(["scontrol", *step], capture_output=True, text=True, timeout=60)
            except (OSError, subprocess.TimeoutExpired) as e:
                return False, f"scontrol {' '.join(step)} failed: {e}"
            if done.returncode != 0:
                return False, f"scontrol {' '.join(step)} failed (exit {done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
    return True, f"Slurm job {job} requeued with --exclude={listed}"


def run_name(env: Mapping[str, str] = os.environ) -> str | None:
    """`slurm-<job>`: the same for every task of the job and again after a requeue."""
    job = job_id(env)
    return f"slurm-{job}" if job else None



@dataclass(frozen=True)
class SlurmTask:
    job_id: str
    nodes: int  # SLURM_NNODES: the nodes of this job step
    tasks: int  # SLURM_NTASKS: processes of this step, the world size Lightning uses
    tasks_per_node: int | None  # SLURM_NTASKS_PER_NODE (--ntasks-per-node), None when not given
    from_srun: bool  # a task of an srun step (SLURM_STEP_ID), not the batch script itself

    def describe(self) -> str:
        per_node = f"{self.tasks_per_node} per node" if self.tasks_per_node else "no --ntasks-per-node"
        return f"Slurm job {self.job_id}: {self.nodes} node(s), {self.tasks} task(s), {per_node}"


def current_task(env: Mapping[str, str] = os.environ) -> SlurmTask | None:
    """The Slurm task this process is, as Lightning will see it; None outside Slurm."""
    if "SLURM_NTASKS" not in env or interactive(env):
        return None
    per_node = env.get("SLURM_NTASKS_PER_NODE")
    return SlurmTask(
        job_id=env.get("SLURM_JOB_ID", "?"),
        nodes=int(env.get("SLURM_NNODES", "1")),
        tasks=int(env["SLURM_NTASKS"]),
        # Lightning reads it as one number; a heterogeneous "2(x3),1" is not supported there either.
        tasks_per_node=int(per_node) if per_node and per_node.isdigit() else None,
        from_srun="SLURM_STEP_ID" in env,
    )


def tasks_per_node(default: int, env: Mapping[str, str] = os.environ) -> int:
    """cluster=slurm's devices: the job's --ntasks-per-node, else its tasks / nodes (a job that gave
    only --ntasks=1), else `default` outside a job (what a login node plans for)."""
    if "SLURM_NTASKS" not in env:
        return default
    per_node = env.get("SLURM_NTASKS_PER_NODE", "")
    if per_node.isdigit():
        return int(per_node)
    return max(int(env["SLURM_NTASKS"]) // int(env.get("SLURM_NNODES", "1")), 1)


def allocation_problems(nodes: int, devices: int, cluster_name: str, task: SlurmTask | None) -> list[Problem]:
    """Problems of running `nodes x devices` processes as this Slurm task (none outside Slurm)."""
    if task is None:
        return []
    where = task.describe()
    if not task.from_srun and task.tasks > 1:
        return [
            Problem(
                "cluster",
                cluster_name,
                f"python runs in the batch script of {where}, not as one of srun's tasks, so Lightning would wait for {task.tasks - 1} rank(s) that never start",
                "start it as `srun python -m tinytrain ...` (the scripts in slurm/ do)",
            )
        ]
    if task.tasks > 1 and task.tasks_per_node is None:
        return [
            Problem(
                "cluster.devices",
                devices,
                f"{where}: Lightning needs the tasks per node",
                "submit with --nodes=N --ntasks-per-node=<GPUs per node> instead of --ntasks",
            )
        ]
    # cluster=slurm reads the allocation, so a disagreement there is an explicit override.
    use_allocation = "remove the override: cluster=slurm reads the allocation" if cluster_name == "slurm" else "use cluster=slurm, which reads the allocation"
    problems = []
    if nodes != task.nodes:
        problems.append(
            Problem("cluster.nodes", nodes, f"disagrees with Slurm job {task.job_id}, which runs on {task.nodes} node(s) (SLURM_NNODES)", f"{use_allocation}; or submit with --nodes={nodes}")
        )
    per_node = task.tasks_per_node or task.tasks
    if devices != per_node:
        problems.append(
            Problem(
                "cluster.devices",
                devices,
                f"disagrees with Slurm job {task.job_id}, which runs {per_node} task(s) per node (SLURM_NTASKS_PER_NODE); Lightning runs one task per device",
                f"{use_allocation}; or submit with --ntasks-per-node={devices} and as many GPUs per node",
            )
        )
    if not problems and nodes * devices != task.tasks:
        problems.append(
            Problem(
                "cluster",
                cluster_name,
                f"srun started {task.tasks} task(s) but nodes({nodes}) x devices({devices}) = {nodes * devices} ({where})",
                "let srun start one task per node and GPU: `srun python -m tinytrain ...` without -n/--ntasks",
            )
        )
    return problems

"""eval.where=slurm: one one-GPU Slurm job per saved checkpoint, which scores it on the run's tasks
(`mode=eval checkpoint.path=<run> eval.step=<N>`: outputs/backfill.py) and appends to evals.csv.

The script carries data only, as mode=sbatch's (cluster/sbatch.py): the step number, paths and
Slurm names, each checked by slurm_values before it is written; the tasks are read by the job from
the run's own config_resolved.yaml. A job that fails leaves `<run>/eval_jobs/step<N>.failed` (its
exit status) beside its log; training is never told to wait for one.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

from tinytrain.cluster import slurm_values
from tinytrain.errors import Problem

FOLDER = "eval_jobs"


def job_name(run_name: str) -> str:
    return f"{run_name}-eval"


def value_problems(cfg, run_dir: str, workdir: str) -> list[Problem]:
    """Every value an eval job script holds, checked before training starts."""
    c = cfg.cluster
    return (
        slurm_values.job_name_problems(job_name(str(cfg.run.name)))
        + slurm_values.name_problems("cluster.partition", c.partition, "use the partition's name as sinfo lists it, e.g. cluster.partition=gpu", allow_list=True)
        + slurm_values.name_problems("cluster.account", c.account, "use the account's name as sacctmgr lists it, e.g. cluster.account=myproject")
        + slurm_values.time_problems(str(c.time))
        + time_format_problems(str(c.time))
        + slurm_values.path_problems("hydra.run.dir", run_dir, "choose a run directory path without spaces, quotes or control characters (run.root=<folder>, run.name=<name>)")
        + slurm_values.path_problems("working directory", workdir, "start the run from a folder whose path has no spaces, quotes or control characters (each eval job starts there)")
    )


def time_format_problems(time: str) -> list[Problem]:
    """sbatch refused each eval job's --time while training went on (0 of N submitted, exit 0)."""
    from tinytrain.cluster.sbatch import TIME_FIX, slurm_time_seconds

    if not slurm_values.time_problems(time) and slurm_time_seconds(time) is None:
        return [Problem("cluster.time", time, "is not a Slurm time limit (each eval job asks for it)", TIME_FIX)]
    return []


def render(cfg, *, run_dir: Path, step: int, workdir: Path, python: str = sys.executable) -> str:
    c = cfg.cluster
    folder = run_dir / FOLDER
    directives = [
        f"--job-name={job_name(str(cfg.run.name))}",
        "--nodes=1",
        "--ntasks=1",
        "--gpus-per-node=1",
        *([f"--cpus-per-task={c.cpus_per_task}"] if c.cpus_per_task else []),
        f"--time={c.time}",
        f"--output={folder}/step{step:07d}-%j.out",
        f"--chdir={workdir}",
        *([f"--partition={c.partition}"] if c.partition else []),
        *([f"--account={c.account}"] if c.account else []),
    ]
    # The run's task folders named on the job's command: they may hold Python, which a mode=eval
    # of a run folder runs only when its command names them (outputs/backfill.inherited_code_problems).
    include = [f"eval.include=[{','.join(slurm_values.hydra_value(str(f)) for f in cfg.eval.include)}]"] if cfg.eval.include else []
    command = " ".join(shlex.quote(a) for a in [python, "-m", "tinytrain", "mode=eval", f"checkpoint.path={slurm_values.hydra_value(str(run_dir))}", f"eval.step={step}", *include, f"hydra.run.dir={slurm_values.hydra_value(f'{folder}/step{step:07d}')}"])
    failed = shlex.quote(str(folder / f"step{step:07d}.failed"))
    return "\n".join(
        [
            "#!/bin/bash",
            f"# Written by tinytrain: scores step {step} of the run {run_dir} on its eval.tasks, appending to its evals.csv.",
            *(f"#SBATCH {d}" for d in directives),
            "",
            "export PYTHONUNBUFFERED=1",
            f'{command} || {{ status=$?; echo "exit $status, job $SLURM_JOB_ID" > {failed}; exit $status; }}',
            "",
        ]
    )


def submit(script: Path) -> tuple[str | None, str]:
    """(job id, None) once sbatch accepted it, else (None, why)."""
    try:
        r = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as e:
        return None, str(e)
    if r.returncode != 0:
        return None, (r.stderr or r.stdout).strip()
    return r.stdout.strip().split(";")[0], ""


def state(job_id: str) -> str:
    """Slurm's state of the job (PENDING, RUNNING, COMPLETED, FAILED, ...), or UNKNOWN."""
    try:
        r = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "UNKNOWN"
    for word in r.stdout.split():
        if word.startswith("JobState="):
            return word.split("=", 1)[1]
    return "UNKNOWN"


def failures(run_dir: Path) -> list[tuple[int, str, Path]]:
    """(step, what the job wrote, its log folder) of each eval job that failed."""
    found = []
    for marker in sorted((run_dir / FOLDER).glob("step*.failed")):
        step = int(marker.name.removeprefix("step").removesuffix(".failed"))
        found.append((step, marker.read_text().strip(), marker.parent))
    return found

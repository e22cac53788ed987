"""mode=sbatch with data.prepare_parts=N: the token store built by a Slurm array job before training.

Written next to job.sbatch (the training job, cluster/sbatch.py):

    prepare.sbatch  an array of N tasks, one node and one task each, no GPU: task i runs
                    `python -m tinytrain mode=prepare <the same overrides> data.prepare_part=i`.
                    Requeue-safe: a part already built is reused, and the build lock
                    (data/build_lock.py) lets a task that lost its node take a dead builder's place.
    submit.sh       submits the array, then the training job with --dependency=afterok on it: training
                    starts only when every part was built (the last task writes the store's manifest).

Every value reaching the scripts is a shell-quoted word (data, never code); the part number is
Slurm's $SLURM_ARRAY_TASK_ID, a number, checked again by tinytrain's own validation.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from tinytrain.cluster.sbatch import SCRIPT_NAME, check_script_values, training_overrides
from tinytrain.cluster.slurm_values import comment_safe, hydra_value

PREPARE_NAME = "prepare.sbatch"
SUBMIT_NAME = "submit.sh"
PREPARE_DIR = "prepare"  # under the run directory: the array tasks' logs and run directories


def _key(override: str) -> str:
    return override.lstrip("+~").split("=", 1)[0]


def render_prepare(cfg, *, overrides: list[str], run_dir: Path, workdir: Path, python: str = sys.executable) -> str:
    c = cfg.cluster
    n = cfg.data.prepare_parts
    run_dir = run_dir.resolve()
    logs = run_dir / PREPARE_DIR
    args = [o for o in training_overrides(overrides) if _key(o) != "data.prepare_part"]
    # One task a part; a node's CPUs for it (the training job's cores per task x its tasks per node).
    cpus = c.cpus_per_task * c.devices if c.cpus_per_task and c.devices else None
    directives = [
        f"--job-name={cfg.run.name}-prepare",
        f"--array=0-{n - 1}",
        "--nodes=1",
        "--ntasks=1",
        *([f"--cpus-per-task={cpus}"] if cpus else []),
        f"--time={c.time}",
        "--requeue",
        "--open-mode=append",
        f"--output={logs}/slurm-%A_%a.out",
        f"--chdir={workdir.resolve()}",
        *([f"--partition={c.partition}"] if c.partition else []),
        *([f"--account={c.account}"] if c.account else []),
    ]
    command = " ".join(shlex.quote(a) for a in [python, "-m", "tinytrain", "mode=prepare", *args])
    return "\n".join(
        [
            "#!/bin/bash",
            f"# Written by tinytrain: the token store of run {comment_safe(shlex.quote(cfg.run.name))} in {n} parts, one per array task.",
            f"# Submitted with its training job by {run_dir / SUBMIT_NAME}.",
            *(f"#SBATCH {d}" for d in directives),
            "",
            "set -euo pipefail",
            "export PYTHONUNBUFFERED=1",
            'part="${SLURM_ARRAY_TASK_ID:?prepare.sbatch runs as a Slurm array task}"',
            'echo "job ${SLURM_ARRAY_JOB_ID}_${part} on ${SLURM_JOB_NODELIST}: part ${part}, restart ${SLURM_RESTART_COUNT:-0}, $(date)"',
            f'srun --kill-on-bad-exit=1 {command} "data.prepare_part=${{part}}" {part_run_dir(logs)}',
            "",
        ]
    )


def part_run_dir(logs: Path) -> str:
    """`hydra.run.dir=<logs>/part-<task id>` as one shell word: the folder quoted for Hydra (where it
    needs quotes) and for the shell, the array task's id expanded by the shell inside Hydra's quotes."""
    quoted = hydra_value(f"{logs}/part-")
    if quoted.endswith("'"):  # Hydra's closing quote goes after the task id
        return shlex.quote(f"hydra.run.dir={quoted[:-1]}") + '"${part}"' + shlex.quote("'")
    return shlex.quote(f"hydra.run.dir={quoted}") + '"${part}"'


def render_submit(run_dir: Path, parts: int) -> str:
    run_dir = run_dir.resolve()
    prepare, train = shlex.quote(str(run_dir / PREPARE_NAME)), shlex.quote(str(run_dir / SCRIPT_NAME))
    return "\n".join(
        [
            "#!/bin/bash",
            f"# Written by tinytrain: the token store in {parts} parts (a Slurm array), then training once every part succeeded.",
            "set -euo pipefail",
            f"prepare=$(sbatch --parsable {prepare})",
            'prepare="${prepare%%;*}"',
            f'train=$(sbatch --parsable --dependency="afterok:${{prepare}}" {train} "$@")',
            'train="${train%%;*}"',
            f'echo "prepare: array job ${{prepare}} ({parts} parts); training: job ${{train}}, after every part"',
            "",
        ]
    )


def write(cfg, overrides: list[str], run_dir: Path) -> Path:
    """prepare.sbatch and submit.sh beside job.sbatch; returns submit.sh."""
    check_script_values(cfg, overrides, run_dir)
    (run_dir / PREPARE_DIR).mkdir(parents=True, exist_ok=True)  # Slurm does not create log folders
    prepare = run_dir / PREPARE_NAME
    prepare.write_text(render_prepare(cfg, overrides=overrides, run_dir=run_dir, workdir=Path.cwd()))
    submit = run_dir / SUBMIT_NAME
    submit.write_text(render_submit(run_dir, cfg.data.prepare_parts))
    for path in (prepare, submit):
        path.chmod(0o755)
    return submit

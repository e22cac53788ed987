"""mode=sbatch: the Slurm batch script that trains the run just planned, written next to its plan.

The script asks Slurm for exactly what the plan assumed (cluster.nodes x cluster.devices tasks, one
GPU each) and starts `srun python -m tinytrain` with the same overrides, training into the same run
directory, so a requeued job finds its checkpoints there.
"""

from __future__ import annotations

import math
import re
import shlex
import sys
from pathlib import Path

from tinytrain.cluster import slurm_values
from tinytrain.cluster.overrides import script_overrides
from tinytrain.errors import ConfigError, Problem

SCRIPT_NAME = "job.sbatch"
# Overrides the rendered command sets itself.
OWN_KEYS = ("mode", "hydra.run.dir")
MAX_SIGNAL_DELAY_S = 65535  # sbatch --signal's largest delay
TIME_FIX = "use minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. cluster.time=24:00:00 or 2-00:00:00"


def sbatch_problems(cfg, overrides: list[str] | None = None, run_dir: Path | None = None) -> list[Problem]:
    """`overrides` and `run_dir`: the command line's and Hydra's (read from Hydra when not given)."""
    c = cfg.cluster
    if c.name != "slurm":
        return [Problem("cluster", c.name, "mode=sbatch writes a Slurm job, and this cluster option has no Slurm settings", "add cluster=slurm (and cluster.nodes, cluster.devices, cluster.partition as needed)")]
    problems = []
    if c.devices is None or c.devices < 1:
        problems.append(Problem("cluster.devices", c.devices, "mode=sbatch needs the GPUs (tasks) per node", "set cluster.devices=8 (or the node's GPU count)"))
    if c.cpus_per_task is not None and c.cpus_per_task < 1:
        problems.append(Problem("cluster.cpus_per_task", c.cpus_per_task, "must be >= 1", "use the node's cores / GPUs, or null to leave it to Slurm"))
    if c.signal_delay_s < 0 or c.signal_delay_s > MAX_SIGNAL_DELAY_S:
        problems.append(Problem("cluster.signal_delay_s", c.signal_delay_s, f"must be 0 to {MAX_SIGNAL_DELAY_S} (sbatch refuses --signal=USR1@<more>)", "use e.g. 300 (seconds before the time limit)"))
    if overrides is None:
        overrides, run_dir = hydra_context()
    values = slurm_values.script_value_problems(cfg, training_overrides(overrides), str(run_dir.resolve()) if run_dir else "", str(Path.cwd()))
    problems += values
    if any(p.key == "cluster.time" for p in values):
        return problems
    limit = slurm_time_seconds(str(c.time))
    if limit is None:
        problems.append(Problem("cluster.time", c.time, "is not a Slurm time limit", TIME_FIX))
    elif c.signal_delay_s >= limit > 0:
        problems.append(Problem("cluster.signal_delay_s", c.signal_delay_s, f"not shorter than cluster.time={c.time} ({limit} s): the warning would come before the job starts", "lower cluster.signal_delay_s or raise cluster.time"))
    return problems


def hydra_context() -> tuple[list[str], Path | None]:
    """The command line's overrides and the run directory, when Hydra composed this config."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return [], None
    from omegaconf import OmegaConf

    # A config composed by Hydra's compose API (tests, tools) has no run directory: None, not an error.
    hydra_cfg = HydraConfig.get()
    output_dir = OmegaConf.select(hydra_cfg, "runtime.output_dir", default=None, throw_on_missing=False)
    return script_overrides(), Path(output_dir) if output_dir else None


# sbatch --time: "minutes", "minutes:seconds", "hours:minutes:seconds", "days-hours",
# "days-hours:minutes", "days-hours:minutes:seconds"; UNLIMITED / infinite for no limit.
SLURM_TIME = re.compile(r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$")


def slurm_time_seconds(text: str) -> int | None:
    """A Slurm time limit in seconds (0: unlimited), or None when Slurm could not parse it."""
    if text.lower() in ("unlimited", "infinite"):
        return 0
    m = SLURM_TIME.fullmatch(text)
    if m is None:
        return None
    if m["days"] is not None:
        d, h, mi, sec = (int(m[k] or 0) for k in ("days", "dh", "dm", "ds"))
    elif m["c"] is not None:
        d, h, mi, sec = 0, int(m["a"]), int(m["b"]), int(m["c"])
    else:
        d, h, mi, sec = 0, 0, int(m["a"]), int(m["b"] or 0)
    # No range per field: Slurm's parser takes 00:90:00 and 1-25 as 90 minutes and 49 hours.
    return ((d * 24 + h) * 60 + mi) * 60 + sec


def training_overrides(overrides: list[str]) -> list[str]:
    """The command line's overrides without the ones the script sets (mode, the run directory)."""
    return [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in OWN_KEYS]


def render(cfg, *, overrides: list[str], run_dir: Path, workdir: Path, python: str = sys.executable, host_peak_bytes: float | None = None) -> str:
    """`host_peak_bytes`: the plan's host memory per node at peak (plan/host_memory.py), said in a
    comment with the --mem that asks for it (not set: a partition's default may be all of a node)."""
    c = cfg.cluster
    run_dir = run_dir.resolve()
    args = [*training_overrides(overrides), f"hydra.run.dir={slurm_values.hydra_value(str(run_dir))}"]
    directives = [
        f"--job-name={cfg.run.name}",
        f"--nodes={c.nodes}",
        f"--ntasks-per-node={c.devices}",  # one task per GPU, as Lightning expects
        f"--gpus-per-node={c.devices}",
        *([f"--cpus-per-task={c.cpus_per_task}"] if c.cpus_per_task else []),
        f"--time={c.time}",
        f"--signal=USR1@{c.signal_delay_s}",  # to srun's tasks: checkpoint, then requeue
        "--requeue",
        "--open-mode=append",  # a requeued job appends to the same log
        f"--output={run_dir}/slurm-%j.out",
        f"--chdir={workdir.resolve()}",  # relative paths in the config mean what they meant here
        *([f"--partition={c.partition}"] if c.partition else []),
        *([f"--account={c.account}"] if c.account else []),
    ]
    command = " ".join(shlex.quote(a) for a in [python, "-m", "tinytrain", *args])
    lines = [
        "#!/bin/bash",
        "# Written by tinytrain from:",
        # Each override quoted, and any control character escaped: no value can leave the comment.
        f"#   python -m tinytrain {slurm_values.comment_safe(' '.join(shlex.quote(o) for o in overrides))}",
        f"# Its plan: {run_dir / 'plan.json'}. Submit with: sbatch {run_dir / SCRIPT_NAME} [more overrides]",
        *([host_memory_comment(host_peak_bytes)] if host_peak_bytes else []),
        *(f"#SBATCH {d}" for d in directives),
        "",
        "set -euo pipefail",
        "export OMP_NUM_THREADS=${SLURM_CPUS_PER_TASK:-1}",
        "export PYTHONUNBUFFERED=1",
        "export NCCL_DEBUG=WARN",
        "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
        # Rank 0's address for the other nodes: the first node's NodeAddr, as slurm/multi_node.sbatch
        # (Lightning would use the node's name, which need not resolve elsewhere).
        'first_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)',
        """MASTER_ADDR=$(scontrol show node -o "$first_node" | grep -o 'NodeAddr=[^ ]*' | cut -d= -f2)""",
        "export MASTER_ADDR",
        'echo "job $SLURM_JOB_ID on $SLURM_JOB_NODELIST (rank 0 at $MASTER_ADDR), restart ${SLURM_RESTART_COUNT:-0}, $(date)"',
        f'srun --kill-on-bad-exit=1 {command} "$@"',
        "",
    ]
    return "\n".join(lines)


def host_memory_comment(peak_bytes: float) -> str:
    gib = peak_bytes / 2**30
    return f"# Host memory per node at peak (the plan's host line): {gib:.1f} GiB. Where the partition gives a job less by default, add: #SBATCH --mem={math.ceil(gib)}G"


def check_script_values(cfg, overrides: list[str], run_dir: Path) -> None:
    """validate() checked these through Hydra; checked again by every writer, for any other caller."""
    problems = slurm_values.script_value_problems(cfg, training_overrides(overrides), str(run_dir.resolve()), str(Path.cwd()))
    if problems:
        raise ConfigError(problems)


def write(cfg, overrides: list[str], run_dir: Path, host_peak_bytes: float | None = None) -> Path:
    check_script_values(cfg, overrides, run_dir)
    path = run_dir / SCRIPT_NAME
    path.write_text(render(cfg, overrides=overrides, run_dir=run_dir, workdir=Path.cwd(), host_peak_bytes=host_peak_bytes))
    path.chmod(0o755)
    return path

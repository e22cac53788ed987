"""The memory of the node a process runs on: what /proc/meminfo says, and what the Slurm job was given."""

from __future__ import annotations

import os
from pathlib import Path

MEMINFO = Path("/proc/meminfo")


def meminfo_bytes(field: str, meminfo: Path = MEMINFO) -> int | None:
    """A /proc/meminfo field (MemTotal, MemAvailable, ...) in bytes, or None where there is none."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def node_memory(environ=os.environ, meminfo: Path = MEMINFO) -> tuple[int | None, str]:
    """This node's memory a run may take, and where the figure comes from: MemTotal, bounded by
    the Slurm job's allocation (--mem, or --mem-per-cpu x its CPUs, or --mem-per-gpu x its GPUs on
    the node) where one is set (--mem=0: all)."""
    found: list[tuple[int, str]] = []
    # MemTotal, not MemAvailable: every rank of a node plans at its own moment, and one that plans
    # after another rank has built its model would see less available and refuse alone.
    total = meminfo_bytes("MemTotal", meminfo)
    if total is not None:
        found.append((total, "MemTotal"))
    mb = {k: int(v) for k in ("SLURM_MEM_PER_NODE", "SLURM_MEM_PER_CPU", "SLURM_CPUS_ON_NODE", "SLURM_MEM_PER_GPU", "SLURM_GPUS_ON_NODE") if (v := environ.get(k, "")).isdigit()}
    if mb.get("SLURM_MEM_PER_NODE"):
        found.append((mb["SLURM_MEM_PER_NODE"] * 2**20, "the Slurm job's --mem"))
    elif mb.get("SLURM_MEM_PER_CPU") and mb.get("SLURM_CPUS_ON_NODE"):
        found.append((mb["SLURM_MEM_PER_CPU"] * mb["SLURM_CPUS_ON_NODE"] * 2**20, "the Slurm job's --mem-per-cpu"))
    elif mb.get("SLURM_MEM_PER_GPU") and mb.get("SLURM_GPUS_ON_NODE"):
        found.append((mb["SLURM_MEM_PER_GPU"] * mb["SLURM_GPUS_ON_NODE"] * 2**20, "the Slurm job's --mem-per-gpu"))
    return min(found) if found else (None, "unknown (no /proc/meminfo)")

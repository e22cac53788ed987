"""`mode=doctor`: one report of what a bug report about a distributed run needs (versions, GPUs,
the Slurm allocation, network interfaces, the NCCL / torch.distributed variables in effect), to
paste as it is. Reads only: no process group, no GPU memory beyond torch's device query."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import sys
from pathlib import Path

from tinytrain.cluster.node_memory import meminfo_bytes

PACKAGES = ("tinytrain-llm", "torch", "lightning", "deepspeed", "transformers", "tokenizers", "accelerate", "hydra-core", "flash-attn", "liger-kernel", "torchao", "peft", "triton")
# Environment variables that change how ranks find and talk to each other.
VARIABLE_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DIST", "TORCH_FR_", "TORCHELASTIC_", "GLOO_", "UCX_", "FI_", "CUDA_", "MASTER_", "TORCH_EXTENSIONS_DIR", "OMP_NUM_THREADS", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK")
SLURM_VARIABLES = ("SLURM_JOB_ID", "SLURM_JOB_NAME", "SLURM_JOB_PARTITION", "SLURM_JOB_NODELIST", "SLURM_NNODES", "SLURM_NTASKS", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_CPUS_PER_TASK", "SLURM_GPUS", "SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "SLURM_JOB_GPUS", "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_RESTART_COUNT", "SLURM_STEP_ID")


def versions() -> list[str]:
    lines = [f"python        {sys.version.split()[0]} ({platform.platform()})"]
    for name in PACKAGES:
        try:
            lines.append(f"{name:<13} {importlib.metadata.version(name)}")
        except importlib.metadata.PackageNotFoundError:
            lines.append(f"{name:<13} not installed")
    import torch

    lines.append(f"torch build   CUDA {torch.version.cuda or 'none'}, cuDNN {torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else 'none'}, HIP {torch.version.hip or 'none'}")
    nccl = "none (CPU build)"
    if torch.cuda.is_available() and torch.distributed.is_nccl_available():
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    lines.append(f"NCCL          {nccl}; gloo {'yes' if torch.distributed.is_gloo_available() else 'no'}")
    return lines


def gpus() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return [f"none visible (CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); CPU: {os.cpu_count()} cores, {memory_gb():.0f} GB"]
    lines = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        lines.append(f"cuda:{i}  {p.name}, compute capability {p.major}.{p.minor}, {p.total_memory / 2**30:.1f} GiB, {p.multi_processor_count} SMs")
    lines.append(f"CPU: {os.cpu_count()} cores, {memory_gb():.0f} GB")
    return lines


def memory_gb() -> float:
    return (meminfo_bytes("MemTotal") or 0) / 1024 / 1e6  # kB / 1e6, as the report has always said


def network() -> list[str]:
    import psutil

    stats = psutil.net_if_stats()
    lines = []
    for name, addresses in sorted(psutil.net_if_addrs().items()):
        ips = [a.address for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6)]
        st = stats.get(name)
        state = f"{'up' if st and st.isup else 'down'}, mtu {st.mtu if st else '?'}, {st.speed if st and st.speed else '?'} Mb/s"
        lines.append(f"{name:<12} {state}: {', '.join(ips) or 'no address'}")
    ib = Path("/sys/class/infiniband")
    lines.append(f"InfiniBand   {', '.join(sorted(p.name for p in ib.iterdir())) if ib.is_dir() else 'none'}")
    lines.append(f"hostname     {socket.gethostname()}")
    return lines


def variables(env=os.environ) -> list[str]:
    chosen = sorted(k for k in env if k.startswith(VARIABLE_PREFIXES))
    return [f"{k}={env[k]}" for k in chosen] or ["none set"]


def slurm(env=os.environ) -> list[str]:
    found = [f"{k}={env[k]}" for k in SLURM_VARIABLES if k in env]
    return found or ["not in a Slurm job"]


def extension_locks() -> list[str]:
    from tinytrain.cluster import extension_locks as locks

    root = locks.extensions_root()
    held = [f"{p} (held by pid {', '.join(map(str, locks.holders(p))) or 'none on this host'})" for p in [*root.glob("*/lock"), *root.glob("*/*/lock")]] if root.is_dir() else []
    return [f"root {root}", *(held or ["no build lock"])]


SECTIONS = (("versions", versions), ("devices", gpus), ("slurm", slurm), ("network", network), ("distributed variables", variables), ("torch extension builds", extension_locks))


def report() -> str:
    lines = ["tinytrain doctor: paste this into a bug report (it holds host names and addresses; edit them out if they are private)"]
    for title, section in SECTIONS:
        lines.append(f"\n## {title}")
        try:
            lines += section()
        except Exception as e:  # noqa: BLE001 - a report with one section missing beats none
            lines.append(f"could not be read: {type(e).__name__}: {e}")
    return "\n".join(lines) + "\n"

"""Hardware table and detection of the local accelerator.

Peaks are vendor dense tensor-core figures (no sparsity) in TFLOP/s. They feed MFU and the
precision policy; nothing here imports torch unless detection is asked for.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tinytrain.errors import Problem


@dataclass(frozen=True)
class GPU:
    name: str
    compute_capability: tuple[int, int]
    bf16: bool  # native bf16 tensor cores (not the emulation torch may report on T4)
    peak_bf16_tflops: float | None
    peak_fp16_tflops: float | None
    memory_gb: float

    @property
    def is_cpu(self) -> bool:
        return False


@dataclass(frozen=True)
class CPU:
    name: str = "cpu"
    bf16: bool = True  # torch autocast supports bf16 on CPU
    compute_capability: None = None
    peak_bf16_tflops: None = None
    peak_fp16_tflops: None = None
    memory_gb: None = None

    @property
    def is_cpu(self) -> bool:
        return True


Hardware = GPU | CPU

# name -> spec. Keys are the names users type in `hardware.gpu=`.
GPUS: dict[str, GPU] = {
    g.name: g
    for g in [
        GPU("V100", (7, 0), False, None, 125.0, 32),
        GPU("T4", (7, 5), False, None, 65.0, 16),
        GPU("A10", (8, 6), True, 125.0, 125.0, 24),
        GPU("A100", (8, 0), True, 312.0, 312.0, 80),
        GPU("A100-40G", (8, 0), True, 312.0, 312.0, 40),
        GPU("A800", (8, 0), True, 312.0, 312.0, 80),
        GPU("H100-SXM", (9, 0), True, 989.0, 989.0, 80),
        GPU("H100-PCIe", (9, 0), True, 756.0, 756.0, 80),
        GPU("H800", (9, 0), True, 989.0, 989.0, 80),
        GPU("H200", (9, 0), True, 989.0, 989.0, 141),
        GPU("H20", (9, 0), True, 148.0, 148.0, 96),
        GPU("L40S", (8, 9), True, 362.0, 362.0, 48),
        GPU("RTX3090", (8, 6), True, 71.0, 71.0, 24),
        GPU("RTX4090", (8, 9), True, 165.0, 165.0, 24),
    ]
}

ALIASES = {"H100": "H100-SXM", "A100-80G": "A100", "RTX-3090": "RTX3090", "RTX-4090": "RTX4090"}

# Patterns over torch.cuda.get_device_name() (e.g. "NVIDIA A800-SXM4-80GB", "Tesla V100-SXM2-32GB",
# "NVIDIA H100 80GB HBM3", "NVIDIA GeForce RTX 4090"). Order matters: most specific first.
_DEVICE_NAME_PATTERNS = [
    (r"H100.*PCIE", "H100-PCIe"),
    (r"H100", "H100-SXM"),
    (r"H800", "H800"),
    (r"H200", "H200"),
    (r"H20\b", "H20"),
    (r"A100.*40GB", "A100-40G"),
    (r"A100", "A100"),
    (r"A800", "A800"),
    (r"A10\b", "A10"),
    (r"L40S", "L40S"),
    (r"V100", "V100"),
    (r"\bT4\b", "T4"),
    (r"RTX 3090", "RTX3090"),
    (r"RTX 4090", "RTX4090"),
]


def known_gpu_names() -> list[str]:
    return sorted(GPUS) + sorted(ALIASES)


def lookup_gpu(name: str) -> GPU | None:
    """Table entry for a user-typed name (case-insensitive, aliases allowed), else None."""
    wanted = name.strip().upper().replace("_", "-")
    for key, gpu in GPUS.items():
        if key.upper() == wanted:
            return gpu
    for alias, key in ALIASES.items():
        if alias.upper() == wanted:
            return GPUS[key]
    return None


def gpu_from_device_name(device_name: str, capability: tuple[int, int]) -> GPU:
    """Match a CUDA device name to the table; unknown GPUs keep their real capability, no peak."""
    upper = device_name.upper()
    for pattern, key in _DEVICE_NAME_PATTERNS:
        if re.search(pattern, upper):
            return GPUS[key]
    return GPU(device_name, capability, capability >= (8, 0), None, None, 0.0)


def detect() -> Hardware:
    """The accelerator this process would train on."""
    import torch

    if not torch.cuda.is_available():
        return CPU()
    name = torch.cuda.get_device_name(0)
    return gpu_from_device_name(name, torch.cuda.get_device_capability(0))


def describe(hw: Hardware) -> str:
    if hw.is_cpu:
        return "cpu"
    major, minor = hw.compute_capability
    return f"{hw.name} (compute capability {major}.{minor})"


def hardware_problems(cfg) -> list[Problem]:
    name = cfg.hardware.gpu
    if name and lookup_gpu(name) is None:
        return [Problem("hardware.gpu", name, "unknown GPU", f"use one of {', '.join(known_gpu_names())}")]
    return []

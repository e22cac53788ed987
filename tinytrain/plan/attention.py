"""The attention implementation for the hardware the run trains on, with its reason.

Order of choice for `model.attention=auto`: torch's own varlen kernel (a CUDA GPU of compute
capability >= 8.0 and a torch that has it: packed documents as one flattened row with their
boundaries, no flash-attn to build) > flash-attn 2 (where installed, same GPUs) > PyTorch SDPA with
the block-diagonal mask built from the position ids (V100, T4, CPU; or the model needs what neither
kernel has). Each choice says why the ones before it were passed over.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from tinytrain.config.schema import Attention
from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.hardware import Hardware, describe
from tinytrain.plan.torch_varlen import MIN_CAPABILITY, VarlenSupport

# The name transformers knows tinytrain/model/varlen_attention.py's forward by (model.attention=varlen).
TORCH_VARLEN = "torch_varlen"
# Implementations that take a packed batch as one flattened row with cu_seq_lens (model/packed_attention.py).
VARLEN_KERNELS = (TORCH_VARLEN, "flash_attention_2")


@dataclass(frozen=True)
class AttentionChoice:
    implementation: str
    reason: str


# flash-attn 2 runs on Ampere and newer only (its README: "Ampere, Ada, or Hopper GPUs").
FLASH_MIN_CAPABILITY = MIN_CAPABILITY


def choose_attention(requested: Attention, *, flash_installed: bool, varlen: VarlenSupport, hardware: Hardware, sliding_window: bool = False, softcap: bool = False, planning: bool = True) -> AttentionChoice:
    """The attention implementation for `hardware` (detected, or named by hardware.gpu), with why.
    `varlen`: what the installed torch's varlen kernel offers; `sliding_window`/`softcap`: what the
    model needs of a kernel. An explicit varlen or flash_attention_2 where it cannot run is a
    ConfigError naming the GPU (or the torch) and the fix."""
    where = describe(hardware)
    capable = not hardware.is_cpu and hardware.compute_capability >= MIN_CAPABILITY
    gap = varlen.gap(sliding_window, softcap)
    if requested == Attention.auto:
        if hardware.is_cpu:
            return AttentionChoice("sdpa", "PyTorch SDPA with a block-diagonal mask because there is no GPU")
        if not capable:
            return AttentionChoice("sdpa", f"PyTorch SDPA with a block-diagonal mask because torch's varlen kernel and flash-attn 2 need compute capability >= 8.0 and {where} has less")
        if gap is None:
            return AttentionChoice(TORCH_VARLEN, f"torch {varlen.torch_version}'s varlen kernel (packed documents by cu_seq_lens) on {where}")
        if flash_installed:
            return AttentionChoice("flash_attention_2", f"flash-attn 2 on {where} because {gap}")
        return AttentionChoice("sdpa", f"PyTorch SDPA with a block-diagonal mask because {gap} and flash-attn is not installed (pip install 'tinytrain-llm[flash-attn]')")
    if requested == Attention.varlen:
        if not capable:
            raise ConfigError(Problem("model.attention", requested.value, f"torch's varlen kernel is FlashAttention's: CUDA GPUs of compute capability >= 8.0 (A100, A800, H100, ...) only, and this run is on {where}", "use model.attention=auto (SDPA with a block-diagonal mask here) or sdpa"))
        if gap is not None:
            fix = "use model.attention=auto (flash-attn 2 or SDPA)" + ("" if varlen.available else ", or install torch >= 2.10")
            raise ConfigError(Problem("model.attention", requested.value, gap, fix))
        return AttentionChoice(TORCH_VARLEN, f"as configured: torch {varlen.torch_version}'s varlen kernel on {where}")
    if requested == Attention.flash_attention_2:
        if not capable:
            raise ConfigError(Problem("model.attention", requested.value, f"flash-attn 2 needs a GPU with compute capability >= 8.0 (A100, A800, H100, ...) and this run is on {where}", "use model.attention=sdpa (or auto, which picks SDPA here)"))
        if not flash_installed:
            if not planning:  # this is the machine that runs it: transformers would refuse after the data and the model are built
                raise ConfigError(Problem("model.attention", requested.value, "needs flash-attn, which is not installed here", "pip install 'tinytrain-llm[flash-attn]', or use model.attention=auto (torch's varlen kernel or SDPA)"))
            return AttentionChoice("flash_attention_2", "as configured; flash-attn is not installed on this machine: the one that trains needs it (pip install 'tinytrain-llm[flash-attn]')")
        return AttentionChoice("flash_attention_2", f"as configured ({where})")
    return AttentionChoice(requested.value, "as configured")


def for_family(choice: AttentionChoice, requested: Attention, family_name: str, sdpa_ok: bool) -> AttentionChoice:
    """SDPA where the family's transformers class has it; eager otherwise (Gemma-2)."""
    if choice.implementation != "sdpa" or sdpa_ok:
        return choice
    if requested == Attention.sdpa:
        raise ConfigError(Problem("model.attention", "sdpa", f"transformers has no SDPA attention for the {family_name} family (its attention soft-capping)", "use model.attention=auto (eager here, flash-attn 2 on a capable GPU) or eager"))
    return AttentionChoice("eager", f"eager because transformers has no SDPA attention for {family_name} (instead of {choice.reason})")


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None

"""The attention implementation for the hardware the run trains on, with its reason."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from tinytrain.config.schema import Attention
from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.hardware import Hardware, describe


@dataclass(frozen=True)
class AttentionChoice:
    implementation: str
    reason: str


# flash-attn 2 runs on Ampere and newer only (its README: "Ampere, Ada, or Hopper GPUs").
FLASH_MIN_CAPABILITY = (8, 0)


def choose_attention(requested: Attention, flash_installed: bool, hardware: Hardware) -> AttentionChoice:
    """The attention implementation for `hardware` (detected, or named by hardware.gpu), with why.
    An explicit flash_attention_2 where it cannot run is a ConfigError naming the GPU and the fix."""
    where = describe(hardware)
    capable = not hardware.is_cpu and hardware.compute_capability >= FLASH_MIN_CAPABILITY
    if requested == Attention.auto:
        if capable and flash_installed:
            return AttentionChoice("flash_attention_2", f"flash-attn is installed and {where} has compute capability >= 8.0")
        if hardware.is_cpu:
            why = "no GPU"
        elif not capable:
            why = f"flash-attn 2 needs compute capability >= 8.0 and {where} has less"
        else:
            why = "flash-attn is not installed (pip install -e '.[gpu]')"
        return AttentionChoice("sdpa", f"PyTorch SDPA because {why}")
    if requested == Attention.flash_attention_2:
        if not capable:
            raise ConfigError(Problem("model.attention", requested.value, f"flash-attn 2 needs a GPU with compute capability >= 8.0 (A100, A800, H100, ...) and this run is on {where}", "use model.attention=sdpa (or auto, which picks SDPA here)"))
        if not flash_installed:
            return AttentionChoice("flash_attention_2", "as configured; flash-attn is not installed on this machine: the one that trains needs it (pip install -e '.[gpu]')")
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

"""Precision policy: hardware + request -> Lightning precision, loss-scale policy, reason.

Pure. The loss-scale policy is one object mapped into both DeepSpeed's fp16 block and torch's
GradScaler, so the two can never disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinytrain.errors import ConfigError, Problem
from tinytrain.hardware import Hardware, describe

REQUESTS = ("auto", "bf16", "fp16", "fp32")
LIGHTNING_PRECISION = {"bf16": "bf16-mixed", "fp16": "16-mixed", "fp32": "32-true"}


@dataclass(frozen=True)
class LossScalePolicy:
    """Dynamic loss scaling for fp16. Scale starts at 2**initial_scale_power, halves on overflow
    (after `hysteresis` consecutive overflows, DeepSpeed), doubles after `window` clean steps,
    never below `min_scale`."""

    initial_scale_power: int = 16
    window: int = 1000
    hysteresis: int = 2
    min_scale: float = 1.0

    def to_deepspeed(self) -> dict:
        return {
            "enabled": True,
            "loss_scale": 0,  # 0 means dynamic in DeepSpeed
            "initial_scale_power": self.initial_scale_power,
            "loss_scale_window": self.window,
            "hysteresis": self.hysteresis,
            "min_loss_scale": self.min_scale,
        }

    def to_grad_scaler_kwargs(self) -> dict:
        # torch's GradScaler has no hysteresis or floor; tinytrain's loss-scale guard enforces
        # the floor at runtime so both backends stop at the same point.
        return {
            "init_scale": float(2**self.initial_scale_power),
            "growth_factor": 2.0,
            "backoff_factor": 0.5,
            "growth_interval": self.window,
        }


@dataclass(frozen=True)
class PrecisionDecision:
    value: str  # Lightning precision string: bf16-mixed | 16-mixed | 32-true
    reason: str
    loss_scale: LossScalePolicy | None  # set only for fp16

    @property
    def short(self) -> str:
        return {"bf16-mixed": "bf16", "16-mixed": "fp16", "32-true": "fp32"}[self.value]

    def to_dict(self) -> dict:
        return {
            "value": self.value,
            "reason": self.reason,
            "loss_scale": asdict(self.loss_scale) if self.loss_scale else None,
        }


def resolve_precision(hw: Hardware, request: str, policy: LossScalePolicy) -> PrecisionDecision:
    if request not in REQUESTS:
        raise ConfigError(
            Problem("precision.request", request, "unknown precision", f"use one of {', '.join(REQUESTS)}")
        )
    where = describe(hw)
    if request == "auto":
        if hw.is_cpu:
            return PrecisionDecision("32-true", "fp32 because no GPU (cpu)", None)
        major, minor = hw.compute_capability
        if hw.bf16 and hw.compute_capability >= (8, 0):
            return PrecisionDecision("bf16-mixed", f"bf16 because compute capability {major}.{minor} >= 8.0 ({hw.name})", None)
        return PrecisionDecision(
            "16-mixed",
            f"fp16 with dynamic loss scaling because {hw.name} has compute capability {major}.{minor} < 8.0 (no native bf16)",
            policy,
        )
    if request == "bf16":
        if not hw.bf16 or (not hw.is_cpu and hw.compute_capability < (8, 0)):
            raise ConfigError(
                Problem(
                    "precision",
                    "bf16",
                    f"{where} has no native bf16 (needs compute capability >= 8.0)",
                    "use precision=fp16 (dynamic loss scaling) or precision=auto, or train on an A100/A800/H100-class GPU",
                )
            )
        return PrecisionDecision("bf16-mixed", f"bf16 as requested ({where} supports it)", None)
    if request == "fp16":
        note = " through an explicit CPU GradScaler plugin" if hw.is_cpu else ""
        return PrecisionDecision("16-mixed", f"fp16 as requested on {where}{note}, dynamic loss scaling", policy)
    return PrecisionDecision("32-true", f"fp32 as requested on {where}", None)

"""Precision policy: hardware + request -> compute dtype, loss-scale policy, reason.

Pure. The decision is a `Dtype` (config/dtype.py: its torch dtype and Lightning's precision name
come with it, so finetune, export and fit take it instead of strings). The loss-scale policy is one object mapped into both
DeepSpeed's fp16 block and torch's GradScaler, so the two can never disagree.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinytrain.config.dtype import Dtype  # the decision's type; other stages import it from here or config/
from tinytrain.config.schema import LossScaleConfig
from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.hardware import Hardware, describe

REQUESTS = ("auto", "bf16", "fp16", "fp32")


@dataclass(frozen=True)
class LossScalePolicy:
    """Dynamic loss scaling for fp16. Scale starts at 2**initial_scale_power, halves on overflow
    (after `hysteresis` consecutive overflows, DeepSpeed), doubles after `window` clean steps,
    never below `min_scale`."""

    # Built from precision.loss_scale (config/schema.py holds the defaults, once).
    initial_scale_power: int
    window: int
    hysteresis: int
    min_scale: float

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
    dtype: Dtype
    reason: str
    loss_scale: LossScalePolicy | None  # set only for fp16

    @property
    def lightning(self) -> str:
        """Lightning's name for it: the Trainer's `precision`, plan.json's `precision.value`."""
        return self.dtype.lightning

    @property
    def is_fp16(self) -> bool:
        return self.dtype is Dtype.fp16

    def to_dict(self) -> dict:
        return {
            "value": self.lightning,
            "dtype": self.dtype.value,
            "reason": self.reason,
            "loss_scale": asdict(self.loss_scale) if self.loss_scale else None,
        }


def resolve_precision(hw: Hardware, request: str, policy: LossScalePolicy, *, deepspeed: bool = False) -> PrecisionDecision:
    if request not in REQUESTS:
        raise ConfigError(
            Problem("precision.request", request, "unknown precision", f"use one of {', '.join(REQUESTS)}")
        )
    where = describe(hw)
    if request == "auto":
        if hw.is_cpu:
            return PrecisionDecision(Dtype.fp32, "fp32 because no GPU (cpu)", None)
        major, minor = hw.compute_capability
        if hw.bf16 and hw.compute_capability >= (8, 0):
            return PrecisionDecision(Dtype.bf16, f"bf16 because compute capability {major}.{minor} >= 8.0 ({hw.name})", None)
        return PrecisionDecision(
            Dtype.fp16,
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
        return PrecisionDecision(Dtype.bf16, f"bf16 as requested ({where} supports it)", None)
    if request == "fp16":
        # DeepSpeed scales the loss in its engine (the config's fp16 block), on a CPU too.
        note = " through DeepSpeed's loss scaler" if deepspeed else " through an explicit CPU GradScaler plugin" if hw.is_cpu else ""
        return PrecisionDecision(Dtype.fp16, f"fp16 as requested on {where}{note}, dynamic loss scaling", policy)
    return PrecisionDecision(Dtype.fp32, f"fp32 as requested on {where}", None)


# Each overflowing step halves the scale once and is skipped: a start above 2^32 skips dozens of
# steps on the way down (DeepSpeed's default start is 2^16).
MAX_SCALE_POWER = 32


def precision_problems(cfg) -> list[Problem]:
    ls = cfg.precision.loss_scale
    problems = []
    if cfg.precision.value is not None:  # the plan's record of its decision: a value set here was never read
        problems.append(
            Problem("precision.value", cfg.precision.value, "is decided by the plan from precision.request and the GPU (config_resolved.yaml records it), not read", "choose the precision with precision=bf16|fp16|fp32|auto (precision.request), and leave precision.value unset")
        )
    if not 0 <= ls.initial_scale_power <= MAX_SCALE_POWER:
        problems.append(Problem("precision.loss_scale.initial_scale_power", ls.initial_scale_power, f"must be between 0 and {MAX_SCALE_POWER} (the scale starts at 2^power)", "use 16 (the default), or 12 for fragile models"))
    for key in ("window", "hysteresis"):
        if getattr(ls, key) < 1:
            problems.append(Problem(f"precision.loss_scale.{key}", getattr(ls, key), "must be >= 1", f"use e.g. precision.loss_scale.{key}={getattr(LossScaleConfig(), key)}"))
    if not ls.min_scale > 0:
        problems.append(Problem("precision.loss_scale.min_scale", ls.min_scale, "must be positive", "use e.g. precision.loss_scale.min_scale=1"))
    elif 0 <= ls.initial_scale_power <= MAX_SCALE_POWER and ls.min_scale > 2.0**ls.initial_scale_power:
        problems.append(
            Problem("precision.loss_scale.min_scale", ls.min_scale, f"above the initial scale 2^{ls.initial_scale_power} = {2.0**ls.initial_scale_power:g}", "lower min_scale, or raise precision.loss_scale.initial_scale_power")
        )
    return problems

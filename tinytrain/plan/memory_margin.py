"""What GPU runs measured against the plan's activation estimate: the margin of error the plan
prints beside it, and the factor it applies where a run measured more than it estimated.

The estimate (plan/memory.py activation_memory) counts what a forward keeps for backward
(plan/activations.py) and the backward's peak on top of it (the loss's gradients over the vocab, or
a checkpointed layer's recompute). Each row here is one measured run (`bash
benchmarks/gpu_check.sh --part headline`, benchmarks/README.md): its peak allocated memory less the
planned weights, gradients and optimizer state, over the planned activations. A factor below 1 is
printed, never applied: one run does not shrink an estimate.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinytrain.config.schema import Checkpointing


@dataclass(frozen=True)
class Measured:
    strategies: tuple[str, ...]  # the layouts the run stands for (weights held whole in fp32, autocast)
    precision: str  # Lightning's precision string the run had
    mode: Checkpointing
    estimated_gib: float  # the plan's activations for that run
    measured_gib: float  # peak allocated less the planned model states
    where: str

    @property
    def ratio(self) -> float:
        return self.measured_gib / self.estimated_gib

    @property
    def factor(self) -> float:
        """What the plan multiplies its activation estimate by: the measured excess, never a cut."""
        return max(self.ratio, 1.0)

    def to_dict(self) -> dict:
        return {**asdict(self), "mode": self.mode.value, "ratio": round(self.ratio, 3), "factor": round(self.factor, 3)}


# No GPU run stands for the count today. The one H100 run so far (TinyLlama-1.1B at 8 x 2048 packed,
# torch 2.11, 2026-11-27: benchmarks/README.md) measured 58.7 GiB at its peak, and read as activations
# (less 16.4 GiB of weights, gradients and AdamW state) 42.3 against the 42.32 then counted. Two
# things make that reading stand for neither side: its loss ran over the bundled tokenizer's 4,096
# rows where the plan counted the model's 32,000 (benchmarks/mfu.py then passed model.vocab_size=32000
# alone), and tinytrain held the previous step's gradients (4.1 GiB) through its forward, since freed
# with the optimizer step. The next headline run (mfu.py on the Llama-2 tokenizer) measures it again.
MEASURED: tuple[Measured, ...] = ()


def measured(strategy: str, precision: str, mode: Checkpointing | str) -> Measured | None:
    """The measurement standing for this layout and checkpointing mode, or None where no GPU run has
    measured it (then the estimate is printed as it is)."""
    mode = Checkpointing(mode)
    return next((m for m in MEASURED if strategy in m.strategies and precision == m.precision and mode is m.mode), None)


def render(margin: dict | None) -> str:
    """The memory line's margin clause (plan.json's memory_per_gpu.margin)."""
    if margin is None:
        return ""
    applied = f"x{margin['factor']:.2f} applied" if margin["factor"] > 1 else "not applied (one run does not shrink an estimate)"
    return f"; activations measured {margin['ratio']:.2f}x the formula for {margin['mode']} ({margin['where']}): {applied}"

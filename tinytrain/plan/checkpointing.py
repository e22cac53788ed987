"""Activation checkpointing: what each mode costs in memory and step time, and which one runs.

`trainer.activation_checkpointing=auto` takes the cheapest mode (in step time) whose memory fits
the GPU: none, then selective, then full. Without a GPU memory to fit against (CPU, an unknown
GPU) auto keeps every activation. Where the strategy cannot take selective's op-level policy
(the strategy table's op_checkpoint_off), selective checkpoints every SELECTIVE_EVERY-th block in
full instead, and the memory model counts that.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinytrain.config.schema import Checkpointing

# Cheapest first: auto takes the first of these that fits.
BY_COST = (Checkpointing.none, Checkpointing.selective, Checkpointing.full)

# Step time relative to no checkpointing at the same MFU. Full recomputes each layer's forward:
# 2N more FLOPs per token on the 6N of a step. Selective recomputes no matmul and no attention,
# only the elementwise ops between them (norms, SwiGLU, RoPE, residuals), which are memory-bound:
# assumed 3% (benchmarks/throughput_levers.py measures the ratio on the machine at hand).
STEP_FACTOR = {Checkpointing.none: 1.0, Checkpointing.selective: 1.03, Checkpointing.full: 4.0 / 3.0}

# The block interval of selective checkpointing where the op-level policy cannot run.
SELECTIVE_EVERY = 2


@dataclass(frozen=True)
class ModeCost:
    micro_batch: int
    mode: str
    activations_gib: float
    total_gib: float
    fits: bool | None
    step_s: float | None  # None without a GPU's peak to estimate from


@dataclass(frozen=True)
class CheckpointingPlan:
    requested: str
    mode: str  # what runs: none | full | selective
    every: int  # checkpoint every every-th block (1: each; selective without the op policy: SELECTIVE_EVERY)
    how: str  # what is recomputed, in words
    reason: str  # why this mode
    table: tuple  # ModeCost per mode (per micro batch under trainer.micro_batch_size=auto)

    def to_dict(self) -> dict:
        return asdict(self)


def every_for(mode: Checkpointing, op_policy_off: str | None) -> int:
    return SELECTIVE_EVERY if mode is Checkpointing.selective and op_policy_off else 1


def describe(mode: Checkpointing, op_policy_off: str | None) -> str:
    if mode is Checkpointing.none:
        return "off: every activation kept for backward"
    if mode is Checkpointing.full:
        return "full: each block keeps its input and recomputes its forward in backward"
    if op_policy_off:
        return f"selective as every {SELECTIVE_EVERY}nd block recomputed in full (the op-level policy cannot run here: {op_policy_off})"
    return "selective: matmul and attention outputs kept, the elementwise ops between them recomputed (torch's selective checkpoint policy)"


def choose(mode_or_auto: Checkpointing, table: list[ModeCost], op_policy_off: str | None, *, requested: Checkpointing | None = None, reason: str = "as configured", gpu_memory_gib: float | None = None) -> CheckpointingPlan:
    """`table`: the cost of each mode in BY_COST (at each candidate micro batch under
    trainer.micro_batch_size=auto, which decided the mode already: `requested` and `reason` then
    say what was asked and why). auto keeps the margin micro_batch_size=auto and parallel.cp=null
    keep (SAFETY_MARGIN of `gpu_memory_gib`): the table's `fits` is the memory check's, the whole GPU."""
    from tinytrain.plan.micro_batch import SAFETY_MARGIN, auto_limit_gib

    requested = requested or mode_or_auto
    if mode_or_auto is not Checkpointing.auto:
        mode = mode_or_auto
    elif all(c.fits is None for c in table):
        mode, reason = Checkpointing.none, "auto: no GPU memory to fit against (CPU or unknown GPU), so every activation is kept"
    else:
        limit = auto_limit_gib(gpu_memory_gib) if gpu_memory_gib else float("inf")
        kept = f"auto's {100 * SAFETY_MARGIN:.0f}% margin"
        within = next((c for c in table if c.fits and c.total_gib <= limit), None)
        fitting = next((c for c in table if c.fits), None)
        if within is not None:
            mode, reason = Checkpointing(within.mode), f"auto: the cheapest mode that fits with {kept}: {within.total_gib:.1f} of {limit:.1f} GiB"
        elif fitting is not None:
            mode, reason = Checkpointing(fitting.mode), f"auto: no mode fits with {kept} ({limit:.1f} GiB); {fitting.mode} is the cheapest that fits the GPU at all, {fitting.total_gib:.1f} GiB"
        else:
            # The least memory, the faster mode on a tie: where the step peaks in its gradients or
            # optimizer step, recomputing saves nothing (the memory line says what would).
            least = min(table, key=lambda c: c.total_gib)
            mode, reason = Checkpointing(least.mode), f"auto: no mode fits; {least.mode} needs the least ({least.total_gib:.1f} GiB; see the memory line)"
    return CheckpointingPlan(requested.value, mode.value, every_for(mode, op_policy_off), describe(mode, op_policy_off), reason, tuple(table))


def render(c: dict, micro_batch: int) -> list[str]:
    lines = [f"recompute  {c['how']} ({c['reason']})"]
    for row in c["table"]:
        step = f"~{row['step_s']:.2f} s/step" if row["step_s"] is not None else "step time n/a (no GPU peak)"
        fits = {True: "fits", False: "does not fit", None: "no GPU to fit"}[row["fits"]]
        chosen = "  <- chosen" if (row["mode"], row["micro_batch"]) == (c["mode"], micro_batch) else ""
        lines.append(f"           micro batch {row['micro_batch']:>3} {row['mode']:<9} activations {row['activations_gib']:8.2f} GiB, total {row['total_gib']:8.2f} GiB, {fits}, {step}{chosen}")
    return lines

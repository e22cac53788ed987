"""Where a training step peaks beyond its weights and optimizer state: the memory line's total.

A step peaks in one of three places, and the total is the largest:
- in the backward, over the activations (their peak: plan/memory.py activation_parts), with the
  gradients beside them only where something holds them through the forward: DDP's buckets
  (gradient_as_bucket_view) and DeepSpeed's flat buffers hold them for the whole run, and gradient
  accumulation from a window's second micro batch. A single process and fsdp_tp at accumulation 1
  free them with each optimizer step (model/module.py optimizer_step): a forward starts without any;
- at the backward's end, over every gradient, with the first layer's recompute under checkpointing;
- in the optimizer step, over every gradient, with the step's own temporaries.

fsdp_tp adds FSDP2's gathered weights to the first two. It all-gathers each block's fp32 weights (no
mixed-precision policy) for its forward and again for its backward, the next block's ahead of it,
and copies the gathered buffer out into the parameters: three blocks' weights at once; the root's
(embeddings, final norm, head) stay gathered from its forward through its backward, as torch leaves
the root unresharded after forward. In the backward each block's unsharded gradients wait for their
reduce-scatter (one block's, and the root's largest table's). All of it is of the whole weights over
tp, whatever dp (a rank gathers every other rank's shard beside its own).

The optimizer step's temporaries, per optimizer kernel: torch's fused AdamW (single and ddp on a
GPU) none; its foreach AdamW (torch's default on CUDA where not fused: fsdp_tp's DTensors) the
square root of every second moment at once, 4 B per local trainable parameter; its per-tensor loop
(the default on a CPU) the previous tensor's denominator beside the current one's square root and
quotient, at most 3 x the largest tensor's 4 B; torch's Muon, one matrix at a time, 3 x the largest
matrix's fp32 bytes with bf16 Newton-Schulz, 5 x in fp32 (fsdp_tp gathers that matrix whole).
Under DeepSpeed's ZeRO the same torch AdamW steps DeepSpeed's flat fp32 partitions, one tensor per
parameter group (ZeRO-3: per sub-group of at most DeepSpeed's 1e9 elements): foreach on a GPU, the
per-tensor loop on a CPU, whose largest tensor is then a whole partition; with the optimizer
offloaded, DeepSpeed's CPU Adam steps on the host and the GPU holds none of it.

Measured on this CPU (tests/integration/test_step_memory.py, benchmarks/step_peak.py): a single
process's step peaks at 0.98-1.01x the count at 5M-150M parameters (the activation count's own
precision); two fsdp_tp ranks at 0.80-0.90x it, where the count before this one (every gradient
beside the activations, nothing gathered) was up to 1.51x under with full checkpointing;
benchmarks/step_peak_ranks.py reads fsdp_tp and ZeRO ranks at 2 and 4 processes (0.72-0.95 and, for
ZeRO's step delta, 0.32-0.89 of the count; up to 2.5x over it before ZeRO's optimizer was counted).
"""

from __future__ import annotations

from dataclasses import dataclass

from tinytrain.plan.model_shape import ModelShape, parameter_count

FP32 = 4


@dataclass(frozen=True)
class StepShape:
    """What a step holds beside its activations and gradients, in bytes per GPU."""

    grads_held: bool  # the gradients live beside the activations (buffers, or accumulation)
    gathered: float = 0.0  # fsdp_tp: gathered weights, forward and backward
    unsharded_grads: float = 0.0  # fsdp_tp: gradients waiting for their reduce-scatter, in the backward
    optimizer_step: float = 0.0  # what the optimizer step allocates beside every gradient
    optimizer_kernel: str = ""  # fused | foreach | per-tensor | offloaded | deepspeed (the step's temporaries)
    why_held: str = ""  # what holds the gradients, or frees them
    muon: bool = False  # trainer.optimizer=muon: Muon's matrices step beside the AdamW kernel's rest


HELD = StepShape(grads_held=True)  # the plain sum: every gradient beside the activations, nothing more


@dataclass(frozen=True)
class StepPeak:
    total: float  # bytes per GPU, weights and optimizer state included
    at: str  # which of the three places


def step_peak(states, activations: float, recompute: float, step: StepShape, reference: float = 0.0) -> StepPeak:
    """The largest of the three places a step peaks. `states`: memory.ModelStateMemory; `activations`:
    their peak; `recompute`: the first layer's recompute at the backward's end (0 without checkpointing)."""
    fixed = states.params + states.optimizer + reference
    fsdp = step.gathered + step.unsharded_grads
    places = (
        (fixed + (states.grads if step.grads_held else 0.0) + activations + fsdp, "backward"),
        (fixed + states.grads + step.optimizer_step, "optimizer_step"),
        (fixed + states.grads + fsdp + recompute, "backward_end"),
    )
    # On a tie the first: the backward's end ties with the optimizer step when it adds nothing to
    # the gradients (no recompute, no FSDP buffers), and the memory line then leaves it out.
    total, at = max(places, key=lambda p: p[0])
    return StepPeak(total, at)


def root_params(shape: ModelShape) -> int:
    """The embeddings, the head unless tied, and the final norm: what FSDP2's root module holds."""
    return shape.vocab * shape.hidden * (1 if shape.tied_embeddings else 2) + shape.hidden


def fsdp_gathered(row, shape: ModelShape, tp: int) -> tuple[float, float]:
    """(gathered weights, unsharded gradients) per rank under fsdp_tp, fp32 over tp; none under the
    strategies whose `row` (plan/parallel.py) holds whole weights or DeepSpeed's partitions."""
    if not row.tensor_parallel:
        return 0.0, 0.0
    root = root_params(shape)
    block = (parameter_count(shape) - root) / shape.layers
    gathered = FP32 * (root + 3 * block) / tp
    unsharded = FP32 * (shape.vocab * shape.hidden + block) / tp
    return gathered, unsharded


def held_everything(row, shape: ModelShape, tp: int) -> StepShape:
    """Every gradient beside the activations, with fsdp_tp's gathered weights: the upper bound where
    the accumulation and the optimizer are not known yet (the context size comes before the batch)."""
    gathered, unsharded = fsdp_gathered(row, shape, tp)
    return StepShape(grads_held=True, gathered=gathered, unsharded_grads=unsharded)


def step_shape(row, *, accumulation: int, shape: ModelShape, optimizer, trainable: int, tp: int, world: int, on_gpu: bool, zero_stage: int = 0, offload_optimizer: bool = False) -> StepShape:
    """`row`: the strategy's (plan/parallel.py); `optimizer`: plan/optimizer.py OptimizerPlan;
    `trainable`: the parameters the optimizer steps."""
    if row.gradient_buffers:
        held, why = True, row.gradient_buffers
    elif accumulation > 1:
        held, why = True, f"accumulation {accumulation}: a window's later micro batches add to the earlier ones' gradients"
    else:
        held, why = False, "the gradients are freed with each optimizer step"
    gathered, unsharded = fsdp_gathered(row, shape, tp)
    kernel = optimizer_kernel(row, on_gpu=on_gpu, offload_optimizer=offload_optimizer, muon=bool(optimizer.muon_params))
    shards = world if row.tensor_parallel else 1  # fsdp_tp shards the states over dp x tp (x cp); single and ddp hold them whole
    flat = deepspeed_flat_elements(trainable, world, zero_stage) if row.deepspeed else None
    return StepShape(held, gathered, unsharded, optimizer_step_bytes(kernel, optimizer, shape, trainable=trainable, shards=shards, flat=flat), kernel, why, bool(optimizer.muon_params))


def optimizer_kernel(row, *, on_gpu: bool, offload_optimizer: bool, muon: bool) -> str:
    if row.deepspeed and offload_optimizer:
        return "offloaded"  # DeepSpeed's CPU Adam steps on the host
    if row.deepspeed and muon:
        return "deepspeed"  # DeepSpeed's MuonWithAuxAdam: not measured, counted as none
    if on_gpu and row.fused_adamw:
        return "fused"
    return "foreach" if on_gpu else "per-tensor"


# DeepSpeed's default stage3 sub_group_size (tinytrain leaves it): ZeRO-3 steps its partition in
# sub-groups of at most this many elements.
ZERO3_SUB_GROUP = 10**9


def deepspeed_flat_elements(trainable: int, world: int, zero_stage: int) -> float:
    """The largest flat fp32 tensor ZeRO hands its optimizer: a parameter group's partition (counted
    as every trainable parameter in one group, over the world), at ZeRO-3 one sub-group of it."""
    partition = trainable / world
    return min(partition, ZERO3_SUB_GROUP) if zero_stage == 3 else partition


def optimizer_step_bytes(kernel: str, optimizer, shape: ModelShape, *, trainable: int, shards: int, flat: float | None = None) -> float:
    """The optimizer step's temporaries per GPU. `optimizer`: plan/optimizer.py OptimizerPlan;
    `trainable`: the parameters it steps (adapters under LoRA); `shards`: what divides them; `flat`:
    under ZeRO, the elements of the largest flat partition the optimizer steps (deepspeed_flat_elements),
    which then stands for both."""
    if flat is not None:  # one flat tensor per group: foreach's temporaries and the loop's largest tensor are a partition's
        return {"offloaded": 0.0, "deepspeed": 0.0, "foreach": FP32 * flat, "per-tensor": 3 * FP32 * flat}[kernel]
    adamw = trainable if not optimizer.muon_params else optimizer.adamw_params
    largest_tensor = min(shape.largest_layer_params, trainable)
    adamw_bytes = {"fused": 0.0, "foreach": FP32 * adamw / shards, "per-tensor": 3 * FP32 * largest_tensor / shards}[kernel]
    if not optimizer.muon_params:
        return adamw_bytes
    rows, cols = optimizer.largest_matrix
    muon = (3 if optimizer.ns_dtype == "bfloat16" else 5) * FP32 * rows * cols
    return max(adamw_bytes, muon)  # Muon's matrices step before AdamW's rest, not beside it


PLACES = {"backward": "the backward", "backward_end": "the backward's end", "optimizer_step": "the optimizer step"}


def render_sum(m: dict) -> str:
    """The memory line's sum from plan.json's memory_per_gpu: the plain sum where every gradient sits
    beside the activations and nothing else does, else the largest of the places a step peaks."""
    s = m.get("step")
    reference = f" + reference {m['reference_gib']:.2f}" if m.get("reference_gib") else ""
    grads, acts, total = f"grads {m['grads_gib']:.2f}", f"activations ~{m['activations_gib']:.2f}", f"{m['total_gib']:.2f} GiB"
    fsdp = bool(s and (s["gathered_gib"] or s["unsharded_grads_gib"]))
    if s is None or (s["grads_held"] and not fsdp and s["peak_at"] == "backward"):
        return f"params {m['params_gib']:.2f} + {grads} + optimizer {m['optimizer_gib']:.2f}{reference} + {acts} = {total}"
    gathered = f" + gathered weights {s['gathered_gib']:.2f} + unsharded grads {s['unsharded_grads_gib']:.2f}" if fsdp else ""
    places = [f"{PLACES['backward']}: {grads + ' + ' if s['grads_held'] else ''}{acts}{gathered}"]
    if fsdp or s["recompute_gib"]:
        recompute = f" + first layer's recompute {s['recompute_gib']:.2f}" if s["recompute_gib"] else ""
        places.append(f"{PLACES['backward_end']}: {grads}{gathered}{recompute}")
    places.append(f"{PLACES['optimizer_step']}: {grads} + {s['optimizer_step_gib']:.2f} ({s['optimizer_kernel']} AdamW{' and Muon' if s.get('muon') else ''})")
    return f"params {m['params_gib']:.2f} + optimizer {m['optimizer_gib']:.2f}{reference} + max({'; '.join(places)}) = {total}, peak in {PLACES[s['peak_at']]} ({s['why']})"

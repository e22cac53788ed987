"""Per-GPU memory estimate for the plan: model states by ZeRO stage / offload / TP, plus activations.

Model states use DeepSpeed's accounting for mixed-precision Adam, per parameter:
16-bit params 2 B, 16-bit grads 2 B, fp32 grads 4 B, fp32 master params 4 B, Adam moments 8 B
(DeepSpeed's estimate_zero2/zero3_model_states_mem_needs: 2 + 18/N for ZeRO-2, 18/N + gathered
layer for ZeRO-3). Without DeepSpeed (single, ddp, fsdp_tp) AMP keeps fp32 params, fp32 grads and
the moments: 16 B per parameter, divided by tp x dp for fsdp_tp. Activations: what a layer of the
model's family keeps per token in the run's layout (plan/activations.py, counted from transformers'
layers; heads and the intermediate width split over tp), plus what grows as seq^2 where no fused
kernel takes the documents' boundaries (eager's scores, SDPA's masks); and the peak of the
backward on top: the loss's fp32 log-softmax and its two gradients over the vocab (one chunk's
under the chunked loss, none under liger's fused loss), or a checkpointed layer's recompute. The
total is where the step peaks (plan/step_peak.py): the states and the activations, with the
gradients beside them only where something holds them, or every gradient at the step's end.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

from tinytrain.config.schema import Checkpointing
from tinytrain.plan.activations import (
    LOGITS_KEPT_BYTES,
    LORA_BASE,
    LOSS_PEAK_BYTES,
    RECOMPUTE_PEAK,
    Layout,
    LoraShape,
    attention_matrix_bytes,
    ends_bytes,
    head_copy_bytes,
    input_bytes,
    layer_bytes,
    ring_gather_bytes,
    selective_bytes,
    softcap_bytes,
    weight_copy_bytes,
)
from tinytrain.plan.step_peak import HELD, StepShape, step_peak

GIB = 1024**3


@dataclass(frozen=True)
class ModelStateMemory:
    params: float  # bytes per GPU
    grads: float
    optimizer: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer


@dataclass(frozen=True)
class StateLayout:
    """What the model-state formulas divide by: the world, tp, the ZeRO stage and offloads."""

    world: int
    tp: int
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_params: bool = False
    largest_layer_params: int = 0  # ZeRO-3 gathers one layer's full weights during its forward
    buckets: float = 0.0  # bytes of ZeRO's reduce buckets (plan/deepspeed_config.py bucket_bytes)
    fp32: bool = False  # training in fp32: DeepSpeed's weights and gradients are 4 B, not 2 (AMP's are 4 B anyway)


@dataclass(frozen=True)
class AdapterStates:
    """A LoRA run's weights: trainable (adapters and trained vocab rows) and frozen (the base),
    with the frozen base's bytes in its own dtype (NF4 under QLoRA)."""

    trainable: float
    frozen: float
    frozen_bytes: float


# The formulas below are the strategy table's memory hooks (plan/parallel.py).


def replicated_states(params: int, layout: StateLayout) -> ModelStateMemory:
    """AMP keeps fp32 params, fp32 grads and the moments: 16 B per parameter on every rank."""
    p = float(params)
    return ModelStateMemory(4 * p, 4 * p, 8 * p)


def sharded_states(params: int, layout: StateLayout) -> ModelStateMemory:
    """The same 16 B per parameter, divided by tp x dp (FSDP2 x TP)."""
    p, shards = float(params), layout.tp * (layout.world // layout.tp)
    return ModelStateMemory(4 * p / shards, 4 * p / shards, 8 * p / shards)


def deepspeed_states(params: int, layout: StateLayout) -> ModelStateMemory:
    """DeepSpeed's estimator's accounting, with ZeRO's reduce buckets among the gradients (its
    estimator leaves them out; they are allocated whatever the model: plan/deepspeed_config.py)."""
    states = _deepspeed_states(params, layout)
    return replace(states, grads=states.grads + layout.buckets)


def _deepspeed_states(params: int, layout: StateLayout) -> ModelStateMemory:
    p, n = float(params), layout.world
    w = 4 if layout.fp32 else 2  # DeepSpeed holds the module's weights and gradients in the training dtype
    opt = 0.0 if layout.offload_optimizer else (4 + 8) * p / n  # fp32 master + moments, partitioned
    if layout.zero_stage == 1:
        return ModelStateMemory(w * p, w * p + (0.0 if layout.offload_optimizer else 4 * p / n), opt)
    if layout.zero_stage == 2:
        return ModelStateMemory(w * p, 0.0 if layout.offload_optimizer else (w + 4) * p / n, opt)
    gathered = 4.0 * layout.largest_layer_params  # one layer's full weights live during its forward
    params_mem = gathered + (0.0 if layout.offload_params else w * p / n)
    # Stage 3 keeps no separate full fp32 gradient: 16-bit grads + the fp32 partition (4 B),
    # as DeepSpeed's estimator counts it (18 B/param over N with the 16-bit params).
    return ModelStateMemory(params_mem, 0.0 if layout.offload_optimizer else 4 * p / n, opt)


def replicated_frozen_copy(params: int, layout: StateLayout) -> float:
    """A frozen copy of the model held like the policy (a preference reference): its fp32 weights only."""
    return 4.0 * params


def sharded_frozen_copy(params: int, layout: StateLayout) -> float:
    return 4.0 * params / (layout.tp * (layout.world // layout.tp))


def deepspeed_frozen_copy(params: int, layout: StateLayout) -> float:
    """In the training dtype under DeepSpeed, partitioned at ZeRO-3 (or offloaded with the parameters)."""
    w = 4.0 if layout.fp32 else 2.0
    if layout.zero_stage == 3:
        return 0.0 if layout.offload_params else w * params / layout.world
    return w * params


def local_adapter_states(a: AdapterStates, layout: StateLayout) -> ModelStateMemory:
    """The frozen base in its dtype, fp32 trainable weights with their gradients and Adam moments."""
    t = a.trainable
    return ModelStateMemory(a.frozen_bytes + 4 * t, 4 * t, 8 * t)


def deepspeed_adapter_states(a: AdapterStates, layout: StateLayout) -> ModelStateMemory:
    """Every weight 16-bit (partitioned at stage 3); only trainable ones have gradients and
    (partitioned) optimizer state."""
    t, frozen, n = a.trainable, a.frozen, layout.world
    opt = 0.0 if layout.offload_optimizer else 12 * t / n
    if layout.zero_stage == 3:
        weights = 4.0 * layout.largest_layer_params + (0.0 if layout.offload_params else 2 * (frozen + t) / n)
        return ModelStateMemory(weights, (0.0 if layout.offload_optimizer else 4 * t / n) + layout.buckets, opt)
    grads = 2 * t + 4 * t / n if layout.zero_stage == 1 else 6 * t / n
    return ModelStateMemory(2 * (frozen + t), (0.0 if layout.offload_optimizer else grads) + layout.buckets, opt)


@dataclass(frozen=True)
class ActivationParts:
    kept: float  # what the forward keeps for backward (the plain loss's log-softmax included)
    backward: float  # what the backward adds at its peak
    layers: float = 0.0  # of `kept`: the layers' activations (and seq^2 masks or scores)
    copies: float = 0.0  # of `kept`: autocast's 16-bit weight copies
    backward_from: str = ""  # what the backward's peak is: the loss's backward or a layer's recompute
    recompute: float = 0.0  # the first layer's recompute, at the backward's end beside every gradient (plan/step_peak.py)

    @property
    def peak(self) -> float:
        return self.kept + self.backward

    def to_gib(self) -> dict:
        """plan.json's memory_per_gpu.activation_parts: each part in GiB (ends_and_loss: the rest of
        what is kept, the model's ends and the plain loss's log-softmax)."""
        return {
            "layers_gib": round(self.layers / GIB, 3),
            "weight_copies_gib": round(self.copies / GIB, 3),
            "ends_and_loss_gib": round((self.kept - self.layers - self.copies) / GIB, 3),
            "backward_peak_gib": round(self.backward / GIB, 3),
            "backward_peak_from": self.backward_from,
        }


def render_activation_parts(parts: dict) -> str:
    """The memory line's second line: what the activation estimate is made of (before any margin)."""
    copies = f" + {parts['weight_copies_gib']:.2f} autocast's weight copies" if parts["weight_copies_gib"] else ""
    return (f"           activations: {parts['layers_gib']:.2f} kept by the layers{copies} + {parts['ends_and_loss_gib']:.2f} by the model's ends and the loss, "
            f"+ {parts['backward_peak_gib']:.2f} at the backward's peak ({parts['backward_peak_from']})")


def activation_memory(**kwargs) -> float:
    """Bytes per GPU of activations at the peak of a training step (activation_parts(), its arguments)."""
    return activation_parts(**kwargs).peak


def activation_parts(*, shape, layout: Layout, seq: int, micro_batch: int, tp: int, flash: bool, cp: int = 1, ring: bool = False, checkpointing: Checkpointing = Checkpointing.none, every: int = 1, logits_tokens: int | None = None, eager: bool = False, lora: LoraShape | None = None) -> ActivationParts:
    """Bytes per GPU of activations, in two parts whose sum is a training step's peak: what the
    forward keeps for backward (plan/activations.py counts a layer of `shape`'s family in `layout`,
    and the model's ends: the final norm and RoPE's tables) and, on top of it, the larger of the
    backward's two transients: the loss's (its log-softmax and two gradients over the vocab, while
    every layer's activations and the ends are still held) and, under checkpointing, the last
    layer's recompute (one layer's activations again, with its gradients: RECOMPUTE_PEAK).
    Under context parallelism (cp) a rank holds seq / cp tokens between attention calls; Ulysses'
    attention sees all seq tokens with heads / cp heads; `ring`'s keeps the keys and values of all
    seq tokens (ring_gather_bytes) and runs a fused kernel (flex attention: no seq^2 held). Without a fused kernel (`flash` false: SDPA
    with a block-diagonal mask, or `eager`) attention keeps masks or scores that grow as seq^2
    (plan/activations.py attention_matrix_bytes). Tensor parallelism splits heads and the
    intermediate width over tp; the hidden-wide tensors and the logits (gathered for the loss:
    model/tensor_parallel.py) stay whole on every tp rank. `checkpointing` (a mode, not auto): full
    keeps only each layer's input; selective keeps its matmuls' and attention's outputs and
    recomputes the rest. `every` > 1 (selective where the op-level policy cannot run): every
    every-th layer is checkpointed in full, the others keep all. `logits_tokens`: the most tokens
    whose logits the loss holds at once (a chunked loss's chunk, 0 for a fused linear cross-entropy;
    None: every token's). Under autocast (the mixed layout) each matmul keeps a 16-bit copy of its
    weight: held with a layer that is not checkpointed, made again in a checkpointed one's recompute
    (plan/activations.py weight_copy_bytes). `lora`: finetune=lora's adapters on a frozen base held
    in the compute dtype (16-bit under autocast: no weight copies, a 16-bit residual stream)."""
    layer_layout, layout = layout, (LORA_BASE[layout] if lora else layout)  # what the rest of the model holds
    layers = shape.layers
    tokens = seq / cp * micro_batch
    per_layer = layer_bytes(shape, layer_layout, tp, lora) * tokens
    per_model = 0.0
    if ring:
        per_layer += ring_gather_bytes(shape, layer_layout, seq=seq, cp=cp, tp=tp) * micro_batch
    if not flash and not ring:
        layer_matrix, model_matrix = attention_matrix_bytes(layout, heads=shape.heads, seq=seq, cp=cp, tp=tp, eager=eager)
        per_layer += layer_matrix * micro_batch
        per_model = model_matrix * micro_batch
    softcap = softcap_bytes(shape, layout)  # Gemma-2's, whose loss is always the plain one (its own logits)
    loss = (tokens if logits_tokens is None else min(tokens, logits_tokens)) * shape.vocab * (LOSS_PEAK_BYTES + softcap)
    loss_kept = tokens * shape.vocab * (LOGITS_KEPT_BYTES + softcap) if logits_tokens is None else 0.0  # the plain loss's log-softmax
    # autocast's 16-bit copy of the lm_head: kept by the plain head's matmul; a chunked loss makes
    # it again in each chunk's recompute (part of its transient); liger's fused loss takes the weight
    head_copy = head_copy_bytes(shape, layout, tp) if logits_tokens != 0 else 0.0
    loss, loss_kept = loss + head_copy, loss_kept + (head_copy if logits_tokens is None else 0.0)
    ends = ends_bytes(shape, layout) * tokens  # the final norm and RoPE's tables: held with the loss, freed before the layers' backward
    copies = weight_copy_bytes(shape, layout, tp)  # autocast's, per layer (none of LoRA's 16-bit base)
    if checkpointing is Checkpointing.none:
        kept, plain_layers, recompute = layers * per_layer, layers, 0.0
    elif checkpointing is Checkpointing.full or every > 1:
        full = -(-layers // every)  # layers 0, every, 2 x every, ...
        kept, plain_layers, recompute = full * input_bytes(shape, layout) * tokens + (layers - full) * per_layer, layers - full, RECOMPUTE_PEAK * per_layer + copies
    elif checkpointing is Checkpointing.selective:
        kept, plain_layers, recompute = layers * selective_bytes(shape, layout, tp, lora) * tokens, 0, RECOMPUTE_PEAK * per_layer + copies
    else:
        raise ValueError(f"activation_memory takes a resolved mode, not {checkpointing}")
    kept_copies = plain_layers * copies + (head_copy if logits_tokens is None else 0.0)
    # The loss's backward ends before the last layer's recompute begins: one or the other, not both.
    backward_from = "the loss's backward" if ends + loss >= recompute else "the last layer's recompute"
    return ActivationParts(
        kept + plain_layers * copies + per_model + ends + loss_kept,
        max(ends + loss, recompute) - ends - loss_kept,
        layers=kept + per_model,
        copies=kept_copies,
        backward_from=backward_from,
        recompute=recompute,
    )


@dataclass(frozen=True)
class MemoryPlan:
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    total_gib: float
    gpu_memory_gib: float | None
    fits: bool | None
    note: str
    reference_gib: float = 0.0  # a frozen DPO/IPO reference copy (finetune.objective, full fine-tuning)
    margin: dict | None = None  # what a GPU run measured against the activation formula (plan/memory_margin.py)
    activation_parts: dict | None = None  # the activation formula's parts (ActivationParts.to_gib)
    step: dict | None = None  # where the step peaks and what is beside the activations (plan/step_peak.py)

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def states_overflow(self) -> bool:
        """Whether the model states alone (weights, gradients, optimizer state, a reference copy) fill
        the GPU: no sequence or micro batch fits then."""
        states = self.params_gib + self.grads_gib + self.optimizer_gib + self.reference_gib
        return self.gpu_memory_gib is not None and states >= self.gpu_memory_gib


def plan_memory(states: ModelStateMemory, activations: float, gpu_memory_gb: float | None, reference: float = 0.0, step: StepShape | None = None, recompute: float = 0.0) -> MemoryPlan:
    """The per-GPU estimate: the states, and the activations' peak where the step peaks (plan/step_peak.py;
    `recompute`: the first layer's recompute at the backward's end). Without `step`, the plain sum:
    every gradient beside the activations (plan.json then carries no `step`)."""
    peak = step_peak(states, activations, recompute, step or HELD, reference)
    total = peak.total
    gpu_gib = gpu_memory_gb * 1e9 / GIB if gpu_memory_gb else None
    fits = None if gpu_gib is None else total / GIB <= gpu_gib
    if gpu_gib is None:
        note = "no GPU memory to compare with (CPU or unknown GPU)"
    elif fits:
        note = f"fits: {total / GIB:.1f} of {gpu_gib:.1f} GiB"
    else:
        note = f"does NOT fit: {total / GIB:.1f} GiB needed, {gpu_gib:.1f} GiB on the GPU"  # the levers left: with_levers
    return MemoryPlan(
        round(states.params / GIB, 3),
        round(states.grads / GIB, 3),
        round(states.optimizer / GIB, 3),
        round(activations / GIB, 3),
        round(total / GIB, 3),
        round(gpu_gib, 1) if gpu_gib else None,
        fits,
        note,
        round(reference / GIB, 3),
        step=step_dict(step, peak, recompute) if step else None,
    )


def memory_levers(par, *, deepspeed: bool, tensor_parallel: bool, checkpointing: str, micro_batch: int, qlora: bool = False, heads: tuple[int, int] = (0, 0), states_only: bool = False, more_gpus: bool = True) -> list[str]:
    """What would lower a run's memory that it does not use already and that the run can take: the
    fixes a memory line that does not fit names (not a higher ZeRO stage to a ZeRO-3 run, not a
    smaller micro batch at 1; no DeepSpeed strategy to finetune=qlora, which runs on single and ddp;
    no larger parallel.tp than the heads allow: `heads` is (num_heads, num_kv_heads)).
    `states_only`: the levers that lower the model states (not the activations'); `more_gpus` False:
    leave out more GPUs (a caller that names the GPU count that fits)."""
    found = []
    if qlora:
        pass  # DeepSpeed would re-partition its 4-bit base: no strategy that partitions states runs it
    elif not deepspeed and not tensor_parallel:
        found += ["parallel=zero3 on more GPUs (the model states partitioned over them)", "parallel=zero3_offload (the optimizer state and weights in host memory)"]
    elif deepspeed and par.zero_stage < 3:
        found.append("parallel=zero3")
    if deepspeed and not par.offload_optimizer:
        found.append("parallel=zero3_offload (the optimizer state and weights in host memory)" if par.zero_stage == 3 else "parallel=zero2_offload (the optimizer state in host memory)")
    if (deepspeed or tensor_parallel) and more_gpus:
        found.append("more GPUs (the states are partitioned over them)")
    larger_tp = next((t for t in range(par.tp + 1, heads[1] + 1) if heads[0] % t == 0 and heads[1] % t == 0), None)
    if tensor_parallel and larger_tp:
        found.append(f"a larger parallel.tp (now {par.tp}; e.g. parallel.tp={larger_tp}, which divides num_heads({heads[0]}) and num_kv_heads({heads[1]}))")
    if states_only:
        return found
    if checkpointing != "full":
        found.append("trainer.activation_checkpointing=full")
    if micro_batch > 1:
        found.append(f"a smaller trainer.micro_batch_size (now {micro_batch})")
    return found


def levers_fix(levers: list[str], *, states: bool = False) -> str:
    """What a run that does not fit is told to try (`levers`: memory_levers; `states`: the model
    states alone do not fit, and a GPU with more memory is one of the levers)."""
    if not levers:
        return "no lever of this strategy is left: a GPU with more memory, or a smaller model"
    return "try " + ", ".join(levers) + (", a GPU with more memory (hardware.gpu), or a smaller model" if states else "")


def with_levers(memory: MemoryPlan, levers: list[str]) -> MemoryPlan:
    """A memory plan that does not fit, its note naming `levers` (memory_levers)."""
    if memory.fits is not False:
        return memory
    states = f" (the model states alone: {memory.params_gib + memory.grads_gib + memory.optimizer_gib + memory.reference_gib:.1f} GiB)" if memory.states_overflow else ""
    return replace(memory, note=f"{memory.note}{states}; {levers_fix(levers, states=memory.states_overflow)}")


def step_dict(step: StepShape, peak, recompute: float) -> dict:
    """plan.json's memory_per_gpu.step: where the step peaks and what is beside the activations, in GiB."""
    return {
        "peak_at": peak.at,
        "grads_held": step.grads_held,
        "why": step.why_held,
        "gathered_gib": round(step.gathered / GIB, 3),
        "unsharded_grads_gib": round(step.unsharded_grads / GIB, 3),
        "recompute_gib": round(recompute / GIB, 3),
        "optimizer_step_gib": round(step.optimizer_step / GIB, 3),
        "optimizer_kernel": step.optimizer_kernel,
        "muon": step.muon,
    }

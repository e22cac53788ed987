"""What a decoder layer keeps for its backward, per token: counted from transformers' own layers.

The plan's activation memory used Korthikanti et al.'s 34 x hidden bytes per token and layer: a
GPT layer (a 4h GELU MLP, dropout masks, every tensor 16-bit). A Llama-family layer keeps more:
SwiGLU holds four intermediate-wide tensors (gate, up, their activation, the product), transformers'
RMSNorm computes in fp32 and keeps its fp32 input, and under autocast (fp32 weights: single, ddp,
fsdp_tp) the residual stream is fp32 and each projection casts its own 16-bit copy of its input.
For Llama-3-8B in 16-bit that is 49 x hidden, not 34.

So the count here is a table per family and activation layout, in bytes per token of each width a
layer has (hidden, heads x head_dim, kv_heads x head_dim, intermediate, and 4 B of attention's fp32
log-sum-exp per head), read off real transformers layers on a CPU: what a forward leaves allocated,
at two depths and two lengths, so the model's ends and fixed costs cancel
(tests/unit/plan/test_activation_count.py measures it again for every family and layout, and fails
when transformers changes what a layer keeps). Attention is counted as a fused kernel (flash, SDPA's
flash or efficient kernel, torch's varlen); where none takes the documents' boundaries, what grows
as seq^2 (eager's scores, SDPA's masks) is attention_matrix_bytes'.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tinytrain.config.dtype import Dtype
from tinytrain.config.schema import Arch


class Layout(str, enum.Enum):
    """How a run holds its activations."""

    sixteen_bit = "16-bit"  # DeepSpeed's bf16/fp16 engine casts the model: 16-bit weights and activations
    mixed = "mixed"  # fp32 weights under autocast (single, ddp, fsdp_tp in bf16-mixed / 16-mixed)
    fp32 = "fp32"  # 32-true (a CPU run)

    @property
    def activation_bytes(self) -> int:
        """A matmul's output: what selective checkpointing keeps."""
        return 4 if self is Layout.fp32 else 2

    @property
    def residual_bytes(self) -> int:
        """The residual stream between layers: what full checkpointing keeps of each layer."""
        return 2 if self is Layout.sixteen_bit else 4


# Per token and vocab row, what the loss holds at the peak of a step, its own backward: its fp32
# log-softmax (kept from the forward by the plain loss, recomputed a chunk at a time by the chunked
# loss) and two fp32 gradients beside it, nll's and log-softmax's (the logits and their fp32 copy
# are freed once the log-softmax is taken). Measured on this CPU for both losses in every layout
# (tests/unit/plan/test_activation_count.py).
LOSS_PEAK_BYTES = 12
LOGITS_KEPT_BYTES = 4  # of which the plain loss keeps from its forward: the log-softmax
# A checkpointed layer's recompute in backward, with the gradients beside it, over the activations
# the layer keeps without checkpointing: measured 1.12 (mixed), 1.23 (16-bit) and 1.26 (fp32) for a
# Llama layer of Llama's proportions (hidden 512, intermediate 3.5 x hidden; Qwen3, Phi-3, Gemma-2
# and Gemma-3 0.88-1.23), 1.17-1.23 for a layer alone at 1k-4k tokens on SDPA's flash kernel
# (benchmarks/long_context_layer.py --tiny).
RECOMPUTE_PEAK = 1.3


def softcap_bytes(shape, layout: Layout) -> float:
    """Per token and vocab row, what Gemma-2's final soft-capping keeps beside the loss (its tanh,
    in the logits' dtype), from the forward through the loss's backward; 0 for other families."""
    return float(layout.activation_bytes) if shape.arch is Arch.gemma2 else 0.0


def layout_of(dtype: Dtype, deepspeed: bool) -> Layout:
    if dtype is Dtype.fp32:
        return Layout.fp32
    return Layout.sixteen_bit if deepspeed else Layout.mixed


@dataclass(frozen=True)
class LayerBytes:
    """Bytes per token a layer keeps, per unit of each of its widths."""

    hidden: float
    q: float  # heads x head_dim
    kv: float  # kv_heads x head_dim
    intermediate: float
    per_head: float = 4.0  # attention's fp32 log-sum-exp

    def per_token(self, shape, tp: int = 1) -> float:
        """Under tensor parallelism (no sequence parallelism) the heads and the intermediate width
        are split over tp; the hidden-wide tensors (norms, the residual, projections' inputs) are
        held whole by every tp rank."""
        split = self.q * shape.heads * shape.head_dim + self.kv * shape.kv_heads * shape.head_dim + self.intermediate * shape.intermediate + self.per_head * shape.heads
        return self.hidden * shape.hidden + split / tp


def by_layout(sixteen_bit, mixed, fp32) -> dict:
    return dict(zip((Layout.sixteen_bit, Layout.mixed, Layout.fp32), (sixteen_bit, mixed, fp32)))


def per_layout(sixteen_bit: tuple, mixed: tuple, fp32: tuple) -> dict:
    """A family's counts, each (hidden, q, kv, intermediate) bytes per token per unit."""
    return {layout: LayerBytes(*widths) for layout, widths in by_layout(sixteen_bit, mixed, fp32).items()}


# Measured with transformers 5.23 (and 5.17: `make test-compat`), torch 2.13, SDPA's flash kernel;
# per layout 16-bit, mixed, fp32.
# Llama, Mistral and Qwen2 build the same layer (Qwen2's q/k/v biases keep nothing more).
LLAMA = per_layout((16, 4, 4, 8), (26, 4, 4, 8), (24, 8, 8, 16))
# Qwen3 adds an RMSNorm over each query and key head (their fp32 input and normed output).
QWEN3 = per_layout((16, 10, 10, 8), (26, 10, 10, 8), (24, 16, 16, 16))
# Phi-3's fused qkv_proj and gate_up_proj keep one output each, split by views.
PHI3 = per_layout((16, 8, 6, 8), (20, 8, 6, 8), (24, 16, 12, 16))
# Gemma-2: four RMSNorms a layer (before and after attention and MLP), each keeping its fp32 input
# and output. Counted on a fused kernel (flash-attn 2 with its soft-capping, a GPU's).
GEMMA2 = per_layout((36, 4, 4, 8), (42, 4, 4, 8), (40, 8, 8, 16))
# Gemma-3: Gemma-2's four norms and query and key norms like Qwen3's (fp32 input and output each).
GEMMA3 = per_layout((36, 12, 12, 8), (42, 12, 12, 8), (40, 16, 16, 16))
COUNTS = {
    Arch.llama: LLAMA,
    Arch.mistral: LLAMA,
    Arch.qwen2: LLAMA,
    Arch.qwen3: QWEN3,
    Arch.phi3: PHI3,
    Arch.gemma2: GEMMA2,
    Arch.gemma3_text: GEMMA3,
}


@dataclass(frozen=True)
class LoraShape:
    rank: int
    dropout: bool  # finetune.dropout > 0


# finetune=lora: the frozen base is held in the compute dtype, so under autocast its residual
# stream is 16-bit (the family's 16-bit count is the base). Over that base, each adapter's lora_A
# keeps its own copy of its projection's input (the frozen projection keeps none: its weight takes
# no gradient), under dropout the dropped copy and its mask besides, and its r-wide output. Measured
# on Llama with peft, adapters on all seven projections (tests/unit/plan/test_activation_count.py),
# per (hidden, q, kv, intermediate) over the base, without and with dropout. Adapters on fewer
# projections keep less: counted as all seven (an upper bound).
LORA_BASE = {Layout.sixteen_bit: Layout.sixteen_bit, Layout.mixed: Layout.sixteen_bit, Layout.fp32: Layout.fp32}
LORA_DELTA = {
    Layout.sixteen_bit: ((-4, 0, 0, 0), (12, 4, 0, 2)),
    Layout.mixed: ((2, 2, 0, 0), (22, 6, 0, 4)),
    Layout.fp32: ((-8, 0, 0, 0), (24, 8, 0, 4)),
}
LORA_PROJECTIONS = 7


def lora_layer_bytes(shape, layout: Layout, tp: int, lora: LoraShape) -> float:
    base = COUNTS[shape.arch][LORA_BASE[layout]].per_token(shape, tp)
    delta = LayerBytes(*LORA_DELTA[layout][lora.dropout], per_head=0.0).per_token(shape, tp)
    return base + delta + LORA_PROJECTIONS * lora.rank * layout.activation_bytes


def layer_bytes(shape, layout: Layout, tp: int = 1, lora: LoraShape | None = None) -> float:
    """Bytes per token one layer keeps for backward without checkpointing, on one tp rank; `lora`:
    with peft's adapters on its projections (lora_layer_bytes)."""
    if lora is not None:
        return lora_layer_bytes(shape, layout, tp, lora)
    return COUNTS[shape.arch][layout].per_token(shape, tp)


def selective_bytes(shape, layout: Layout, tp: int = 1, lora: LoraShape | None = None) -> float:
    """Bytes per token a layer keeps under selective checkpointing (model/activation_checkpointing.py's
    policy), on one tp rank: the matmuls' outputs (q, k, v, gate, up split over tp; o and down whole,
    and under tp > 1 their all-reduced sums too: the policy keeps tp's reductions) and attention's
    output and log-sum-exp, plus the layer's input that the checkpoint holds. With LoRA's adapters
    (`layout` the base's) the policy keeps their matmuls' outputs too: lora_B's at each projection's
    output width, lora_A's r wide (measured on Llama with peft, the same test)."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    split = layout.activation_bytes * (2 * q + 2 * kv + 2 * shape.intermediate) + 4.0 * shape.heads
    whole = layout.activation_bytes * 2 * shape.hidden * (2 if tp > 1 else 1)
    if lora is not None:
        split += layout.activation_bytes * (q + 2 * kv + 2 * shape.intermediate)
        whole += layout.activation_bytes * (2 * shape.hidden + LORA_PROJECTIONS * lora.rank)
    return split / tp + whole + input_bytes(shape, layout)


def attention_matrix_bytes(layout: Layout, *, heads: int, seq: int, cp: int, tp: int, eager: bool) -> tuple[float, float]:
    """(per layer, per model) bytes per sequence of what attention keeps that grows as seq^2, where
    no fused kernel takes the documents' boundaries. Eager attention keeps each head's fp32 softmax
    and its 16-bit copy (heads / cp / tp of them). SDPA with a mask keeps no scores, but turns
    transformers' boolean block-diagonal mask (1 B per pair, one per model) into one in the
    activations' dtype at every call, which each layer keeps for backward; under cp > 1 tinytrain's
    Ulysses path builds that additive mask once per forward instead (model/context_parallel.py).
    Every rank of a cp group attends over the whole sequence, so the mask is not divided by cp."""
    pairs = float(seq) * seq
    if eager:
        return heads / cp / tp * pairs * (4 + (0 if layout is Layout.fp32 else layout.activation_bytes)), pairs
    if cp > 1:
        return 0.0, layout.activation_bytes * pairs
    return layout.activation_bytes * pairs, pairs


def ring_gather_bytes(shape, layout: Layout, *, seq: int, cp: int, tp: int) -> float:
    """Bytes per sequence one layer keeps beyond its own seq / cp tokens under ring (parallel.cp_kind=ring):
    the keys and values all-gathered over the cp group, which the attention kernel saves for its
    backward (layer_bytes counts the rank's own share of them). Heads split over tp."""
    return 2.0 * shape.kv_heads * shape.head_dim / tp * layout.activation_bytes * seq * (cp - 1) / cp


# The final RMSNorm's bytes per token per hidden unit, per layout: the residual, its fp32 copy and
# the normed output (the head's input). Gemma's (1 + weight) norm keeps its fp32 product in 16-bit too.
FINAL_NORM_DEFAULT = by_layout(8, 10, 12)
GEMMA_FINAL_NORM = by_layout(10, 10, 12)
FINAL_NORM = {Arch.gemma2: GEMMA_FINAL_NORM, Arch.gemma3_text: GEMMA_FINAL_NORM}


def ends_bytes(shape, layout: Layout) -> float:
    """Bytes per token the model keeps outside its layers, whole on every tp rank: the final RMSNorm
    and RoPE's cos and sin, shared by every layer (in the residual's dtype). Measured for every
    family at hidden 512, head_dim 64 (tests/unit/plan/test_activation_count.py): 8.5 (Gemma 10.5)
    in 16-bit, 11 mixed and 13 fp32 x hidden; freed by the time the last layer's backward begins."""
    norm = FINAL_NORM.get(shape.arch, FINAL_NORM_DEFAULT)[layout] * shape.hidden
    return norm + 2 * shape.head_dim * layout.residual_bytes


def weight_copy_bytes(shape, layout: Layout, tp: int = 1) -> float:
    """Bytes per layer that autocast adds, whatever the tokens: a projection under autocast (the
    mixed layout) multiplies by a 16-bit copy of its fp32 weight and keeps that copy for its
    backward, from the layer's forward to the layer's backward (a checkpointed layer's copies are
    made again in its recompute). Split over tp as the projections are; never over the data-parallel
    ranks (FSDP's gathered weights are copied whole). 0 where the weights are already 16-bit
    (DeepSpeed) or fp32 runs in fp32. Measured by tests/unit/plan/test_activation_count.py."""
    if layout is not Layout.mixed:
        return 0.0
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    return 2.0 * shape.hidden * (2 * q + 2 * kv + 3 * shape.intermediate) / tp


def head_copy_bytes(shape, layout: Layout, tp: int = 1) -> float:
    """The lm_head's 16-bit copy under autocast (split by vocab rows over tp), as weight_copy_bytes."""
    return 2.0 * shape.vocab * shape.hidden / tp if layout is Layout.mixed else 0.0


def input_bytes(shape, layout: Layout) -> float:
    """Bytes per token of a layer's input: all that full checkpointing keeps of the layer (whole on
    every tp rank)."""
    return layout.residual_bytes * shape.hidden

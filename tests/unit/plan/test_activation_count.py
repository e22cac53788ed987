"""The plan's count of what a decoder layer keeps for backward (plan/activations.py) against what a
real transformers layer of each family leaves allocated after its forward, on this CPU
(tests/activation_bytes.py: glibc's allocator count, at two depths and two lengths). Korthikanti's
34 x hidden bytes (the count before) is 29-73% under every row of this shape.
"""

import dataclasses

import pytest
import torch
import transformers

from tests.activation_bytes import VOCAB, has_mallinfo2, heap_frozen, kept_and_peak_by_loss, kept_by_loss, per_layer_token
from tinytrain.config.schema import Checkpointing
from tinytrain.model.activation_checkpointing import apply_checkpointing
from tinytrain.model.module import CausalLMModule
from tinytrain.model.module_spec import ModuleSpec
from tinytrain.plan.activations import Layout, input_bytes, layer_bytes, selective_bytes
from tinytrain.plan.model_shape import shape_from_hf

pytestmark = pytest.mark.skipif(not has_mallinfo2(), reason="glibc before 2.33 has no mallinfo2")
TOLERANCE = 0.03
# Gemma-2 refuses SDPA by name (its soft-capping); with soft-capping off, SDPA's fused kernel under
# another name keeps what flash-attn 2 (a GPU's Gemma-2 kernel) does.
FUSED = "fused_reference"
transformers.AttentionInterface.register(FUSED, transformers.integrations.sdpa_attention.sdpa_attention_forward)
transformers.masking_utils.AttentionMaskInterface.register(FUSED, transformers.masking_utils.sdpa_mask)
CONFIGS = {
    "llama": transformers.LlamaConfig,
    "mistral": transformers.MistralConfig,
    "qwen2": transformers.Qwen2Config,
    "qwen3": transformers.Qwen3Config,
    "phi3": transformers.Phi3Config,
    "gemma2": transformers.Gemma2Config,
    "gemma3_text": transformers.Gemma3TextConfig,
}


@pytest.fixture(autouse=True, scope="module")
def _collections_walk_the_readings_alone():
    """Each reading's full collections walk what it allocated, not the test worker's whole heap (every
    collected test module's imports): 5 s a test here unfrozen, under 1 s frozen, where the worker's
    earlier in-process CLI runs had left the heap unfrozen (tests/activation_bytes.py heap_frozen)."""
    with heap_frozen():
        yield


def config(arch: str, layers: int):
    # Grouped-query heads whose width (8 x 64) is not the hidden size, as Qwen3 and Gemma have.
    shape = dict(hidden_size=256, intermediate_size=704, num_attention_heads=8, num_key_value_heads=2, head_dim=64, num_hidden_layers=layers, vocab_size=VOCAB, use_cache=False, pad_token_id=0)
    if arch in ("gemma2", "gemma3_text"):
        shape["layer_types"] = ["full_attention"] * layers
    if arch == "gemma2":  # its soft-capping has no SDPA path; flash-attn 2 (a GPU's) keeps what SDPA's kernel does
        shape["attn_logit_softcapping"] = None
    return CONFIGS[arch](**shape)


def build(arch: str, layers: int, layout: Layout, mode: Checkpointing = Checkpointing.none):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config(arch, layers), attn_implementation=FUSED if arch == "gemma2" else "sdpa")
    model = model.to(torch.bfloat16 if layout is Layout.sixteen_bit else torch.float32).train()
    apply_checkpointing(model, mode.value)
    return model


def measured(arch: str, layout: Layout, mode: Checkpointing = Checkpointing.none) -> float:
    return per_layer_token(lambda layers: build(arch, layers, layout, mode), autocast=layout is Layout.mixed)


def planned_shape(arch: str):
    return shape_from_hf(config(arch, 1), VOCAB)


@pytest.mark.parametrize("layout", list(Layout), ids=lambda x: x.value)
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_a_layer_keeps_what_the_plan_counts(arch, layout):
    measured_bytes, planned = measured(arch, layout), layer_bytes(planned_shape(arch), layout)
    assert planned == pytest.approx(measured_bytes, rel=TOLERANCE), f"{arch} {layout.value}: measured {measured_bytes:.0f} B per token and layer, planned {planned:.0f}"


LORA_CASES = [(layout, dropout, Checkpointing.none) for layout in Layout for dropout in (0.0, 0.05)] + [(Layout.mixed, 0.05, mode) for mode in (Checkpointing.selective, Checkpointing.full)]


@pytest.mark.parametrize(("layout", "dropout", "mode"), LORA_CASES, ids=lambda x: getattr(x, "value", f"dropout{x}"))
def test_a_lora_layer_keeps_what_the_plan_counts(layout, dropout, mode):
    """finetune=lora through tinytrain's own apply_adapters (peft, adapters on all seven projections):
    the frozen base in the compute dtype under autocast, everything 16-bit under DeepSpeed, fp32 on a
    CPU run. The base's own count under autocast (an fp32 residual stream) was 5% over without
    dropout and 38% under with finetune=lora's default dropout of 0.05; under selective
    checkpointing the policy keeps the adapters' matmul outputs too (the base's count: 0.55x)."""
    from tinytrain.model.lora import apply_adapters
    from tinytrain.plan.activations import LORA_BASE, LoraShape
    from tinytrain.plan.finetune import FinetunePlan

    plan = FinetunePlan("lora", 16, 32.0, dropout, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), 0, (), "", 0, "bf16", "test")

    def lora_model(layers: int):
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config("llama", layers), attn_implementation="sdpa")
        model = apply_adapters(model, plan, torch.bfloat16 if layout is Layout.mixed else None)
        model = model.to(torch.bfloat16) if layout is Layout.sixteen_bit else model
        apply_checkpointing(model, mode.value)
        return model

    measured_bytes = per_layer_token(lora_model, autocast=layout is Layout.mixed)
    shape, lora, base = planned_shape("llama"), LoraShape(rank=16, dropout=dropout > 0), LORA_BASE[layout]
    planned = {Checkpointing.none: layer_bytes(shape, layout, lora=lora), Checkpointing.selective: selective_bytes(shape, base, lora=lora), Checkpointing.full: input_bytes(shape, base)}[mode]
    assert planned == pytest.approx(measured_bytes, rel=TOLERANCE), f"{layout.value} {mode.value}: measured {measured_bytes:.0f} B per token and layer, planned {planned:.0f}"


@pytest.mark.parametrize("layout", list(Layout), ids=lambda x: x.value)
@pytest.mark.parametrize("mode", [Checkpointing.full, Checkpointing.selective], ids=lambda x: x.value)
def test_a_checkpointed_layer_keeps_what_the_plan_counts(mode, layout):
    """Through tinytrain's own checkpointing (model/activation_checkpointing.py): full keeps each
    layer's input, selective its matmuls' and attention's outputs beside it."""
    shape = planned_shape("llama")
    planned = input_bytes(shape, layout) if mode is Checkpointing.full else selective_bytes(shape, layout)
    assert planned == pytest.approx(measured("llama", layout, mode), rel=TOLERANCE)


@pytest.mark.parametrize("layout", list(Layout), ids=lambda x: x.value)
@pytest.mark.parametrize("arch", list(CONFIGS))
def test_the_model_s_ends_keep_what_the_plan_counts(arch, layout):
    """Outside its layers a model keeps the final norm's tensors and RoPE's cos and sin: what one
    layer's model keeps per token (two lengths) less the layer and what the loss keeps (its
    log-softmax; Gemma-2's soft-capped logits keep their tanh too, counted by softcap_bytes)."""
    from tests.activation_bytes import kept_after_forward
    from tinytrain.plan.activations import LOGITS_KEPT_BYTES, ends_bytes, softcap_bytes

    def kept(seq: int) -> int:
        model = build(arch, 1, layout)
        return min(kept_after_forward(model, autocast=layout is Layout.mixed, seq=seq) for _ in range(2))

    shape = planned_shape(arch)
    measured = (kept(512) - kept(256)) / 256 - layer_bytes(shape, layout) - (LOGITS_KEPT_BYTES + softcap_bytes(shape, layout)) * VOCAB
    assert ends_bytes(shape, layout) == pytest.approx(measured, rel=TOLERANCE), f"{arch} {layout.value}: measured {measured / shape.hidden:.2f} x hidden"


def tiny_module(vocab: int, layout: Layout, chunk: int, hidden: int = 256, intermediate: int = 704, layers: int = 1, checkpointing: Checkpointing = Checkpointing.none):
    cfg = transformers.LlamaConfig(hidden_size=hidden, intermediate_size=intermediate, num_attention_heads=hidden // 64, num_key_value_heads=2, head_dim=64, num_hidden_layers=layers, vocab_size=vocab, use_cache=False)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").to(torch.bfloat16 if layout is Layout.sixteen_bit else torch.float32).train()
    apply_checkpointing(model, checkpointing.value)
    return cfg, CausalLMModule(model, ModuleSpec(vocab, loss_chunk_tokens=chunk))


def kept_and_peak(module, layout: Layout, seq: int) -> tuple[int, int]:
    """The smaller of two readings of each, the parameters' gradients dropped after each."""
    readings = []
    for _ in range(2):
        readings.append(kept_and_peak_by_loss(module.batch_loss, autocast=layout is Layout.mixed, seq=seq))
        module.zero_grad(set_to_none=True)
    return min(r[0] for r in readings), min(r[1] for r in readings)


@pytest.mark.parametrize("chunk", [0, 128], ids=["plain", "chunked"])
def test_the_loss_keeps_the_logits_the_plan_counts(chunk):
    """tinytrain's own loss (CausalLMModule.batch_loss) over a 4096-row vocab, one layer, under
    autocast. The plain loss keeps its fp32 log-softmax of every token (the plan's 4 B per vocab row);
    the chunked loss (trainer.loss_chunk_tokens) keeps no logits past its forward. Beside them the
    layer and the model's ends (the final norm, RoPE's tables)."""
    from tinytrain.plan.memory import activation_parts

    vocab, seq = 4096, 512
    cfg, module = tiny_module(vocab, Layout.mixed, chunk)
    kept = {n: min(kept_by_loss(module.batch_loss, autocast=True, seq=n) for _ in range(2)) for n in (seq, 2 * seq)}
    per_token = (kept[2 * seq] - kept[seq]) / seq
    planned_kept = {n: activation_parts(shape=shape_from_hf(cfg, vocab), layout=Layout.mixed, seq=n, micro_batch=1, tp=1, flash=True, logits_tokens=chunk or None).kept for n in (seq, 2 * seq)}
    planned = (planned_kept[2 * seq] - planned_kept[seq]) / seq  # per token: autocast's weight copies cancel, as measured
    if chunk:  # its checkpointed chunks hold the fp32 hidden states, where the plain head's input is a 16-bit copy
        assert planned <= per_token <= planned + 3 * cfg.hidden_size, (per_token, planned)
    else:
        assert planned == pytest.approx(per_token, rel=TOLERANCE), (per_token, planned)


@pytest.mark.parametrize("mode", [Checkpointing.none, Checkpointing.selective, Checkpointing.full], ids=lambda x: x.value)
@pytest.mark.parametrize("chunk", [0, 128], ids=["plain", "chunked"])
def test_autocast_s_weight_copies_are_what_the_plan_counts(chunk, mode):
    """What a forward keeps whatever its tokens (the reading at zero tokens, from two lengths),
    under autocast: each projection's 16-bit copy of its fp32 weight, kept for the backward by every
    layer not checkpointed (none of a checkpointed one's: its recompute makes them again), and the
    lm_head's by the plain loss (a chunked loss makes it again per chunk). Two layers, a 4096-row
    vocab through tinytrain's own loss; the plan's count read the same way."""
    from tinytrain.plan.memory import activation_parts

    vocab, seq = 4096, 128
    cfg, module = tiny_module(vocab, Layout.mixed, chunk, layers=2, checkpointing=mode)
    kept = {n: min(kept_by_loss(module.batch_loss, autocast=True, seq=n) for _ in range(2)) for n in (seq, 2 * seq)}
    planned = {n: activation_parts(shape=shape_from_hf(cfg, vocab), layout=Layout.mixed, seq=n, micro_batch=1, tp=1, flash=True, checkpointing=mode, logits_tokens=chunk or None).kept for n in (seq, 2 * seq)}
    measured_fixed, planned_fixed = 2 * kept[seq] - kept[2 * seq], 2 * planned[seq] - planned[2 * seq]
    copies = 2 * sum(p.numel() for name, p in module.model.named_parameters() if name.endswith("proj.weight") or name == "lm_head.weight")
    # ~0.1 MiB more is read at every setting (a fixed allocation of the forward's, not counted)
    assert planned_fixed == pytest.approx(measured_fixed, abs=0.05 * copies), f"measured {measured_fixed / 2**20:.2f} MiB, planned {planned_fixed / 2**20:.2f} (all copies {copies / 2**20:.2f})"


@pytest.mark.parametrize("layout", list(Layout), ids=lambda x: x.value)
@pytest.mark.parametrize("chunk", [0, 128], ids=["plain", "chunked"])
def test_the_loss_s_backward_peaks_where_the_plan_counts(chunk, layout):
    """A step's peak comes in the loss's backward, while every layer's activations are held: the
    fp32 log-softmax and two fp32 gradients beside it, 12 B per vocab row (the plain loss kept 4 of
    them from its forward; the chunked loss recomputes them a chunk at a time). Over a 4096-row
    vocab and a small hidden width, where the vocab terms dominate: the plain loss's excess per
    token (two lengths), the chunked loss's per chunk token (two chunk sizes at one length). An H100
    run read 1.11x a count without this (benchmarks/README.md)."""
    from tinytrain.plan.memory import activation_parts

    vocab, seq = 4096, 512
    excess, planned = {}, {}
    for size in ((0,) if not chunk else (chunk, 2 * chunk)):
        cfg, module = tiny_module(vocab, layout, size, hidden=128, intermediate=256)
        shape = shape_from_hf(cfg, vocab)
        for n in (seq, 2 * seq) if not chunk else (seq,):
            kept, peak = kept_and_peak(module, layout, n)
            excess[size, n] = peak - kept
            planned[size, n] = activation_parts(shape=shape, layout=layout, seq=n, micro_batch=1, tp=1, flash=True, logits_tokens=size or None).backward
    if chunk:
        measured, counted = (excess[2 * chunk, seq] - excess[chunk, seq]) / chunk, (planned[2 * chunk, seq] - planned[chunk, seq]) / chunk
    else:
        measured, counted = (excess[0, 2 * seq] - excess[0, seq]) / seq, (planned[0, 2 * seq] - planned[0, seq]) / seq
    assert counted == pytest.approx(measured, rel=TOLERANCE), f"{layout.value}: measured {measured / vocab:.2f} B per vocab row, planned {counted / vocab:.2f}"


@pytest.mark.parametrize("layout", list(Layout), ids=lambda x: x.value)
def test_a_checkpointed_layer_s_recompute_is_within_what_the_plan_counts(layout):
    """Under full checkpointing with no logits to speak of (a 256-row vocab), the backward's peak is
    the last layer's recompute with its gradients: counted as RECOMPUTE_PEAK x the layer's
    activations, at most 20% over what a Llama layer of Llama's proportions (intermediate 3.5 x
    hidden, heads x head_dim = hidden) measures, never under."""
    from tinytrain.plan.memory import activation_parts

    seq = 256
    excess, planned = {}, {}
    cfg, module = tiny_module(VOCAB, layout, 0, hidden=512, intermediate=1792, layers=2, checkpointing=Checkpointing.full)
    for n in (seq, 2 * seq):
        kept, peak = kept_and_peak(module, layout, n)
        excess[n] = peak - kept
        planned[n] = activation_parts(shape=shape_from_hf(cfg, VOCAB), layout=layout, seq=n, micro_batch=1, tp=1, flash=True, checkpointing=Checkpointing.full).backward
    measured, counted = (excess[2 * seq] - excess[seq]) / seq, (planned[2 * seq] - planned[seq]) / seq
    assert measured <= counted <= 1.2 * measured, f"{layout.value}: measured {measured:.0f} B per token, planned {counted:.0f}"


@pytest.mark.parametrize("layout", [Layout.mixed, Layout.fp32], ids=lambda x: x.value)
@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_what_grows_as_the_square_of_the_sequence_is_what_the_plan_counts(attention, layout):
    """Without a varlen kernel (a CPU, V100, T4) packed documents go to SDPA with transformers'
    block-diagonal mask, which SDPA turns into one in the activations' dtype at every layer; eager
    attention (Gemma-2 on a CPU) keeps each head's softmax. Through tinytrain's own loss, packed
    documents of 128 tokens, at 2048 tokens where the seq^2 terms dominate: per layer, and the
    model's one boolean mask. Korthikanti's 5 B per head and pair (the count before) was 20 here."""
    from tinytrain.plan.memory import activation_parts

    seq = 2048
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=1, vocab_size=VOCAB, use_cache=False)

    def kept(layers: int) -> int:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**{**cfg.to_dict(), "num_hidden_layers": layers}), attn_implementation=attention).train()
        module = CausalLMModule(model, ModuleSpec(VOCAB))
        packed = lambda batch: module.batch_loss({**batch, "position_ids": (torch.arange(seq) % 128)[None]})  # noqa: E731
        return min(kept_by_loss(packed, autocast=layout is Layout.mixed, seq=seq) for _ in range(2))

    one, two = kept(1), kept(2)
    shape = shape_from_hf(cfg, VOCAB)
    planned = {n: activation_parts(shape=dataclasses.replace(shape, layers=n), layout=layout, seq=seq, micro_batch=1, tp=1, flash=False, eager=attention == "eager").kept for n in (1, 2)}
    assert planned[2] - planned[1] == pytest.approx(two - one, rel=0.05)  # a layer
    assert planned[1] == pytest.approx(one, rel=0.15)  # the model: one layer, its masks, the model's ends, the loss

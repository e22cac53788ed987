"""The attention Ulysses wraps (model/context_parallel.py), on one process: at cp=1 Ulysses' gather
is the identity, so what each rank's attention sees is the whole rows, as here. The training
forward hands every layer the whole rows' boundaries from `ContextGroup.shard`: packed documents
stay apart exactly as when the attention finds them in the position ids, and no layer asks the
device for a value (on a GPU each such op waits for every kernel queued before it). The SDPA mask
is built once per forward, also in compiled, selectively checkpointed blocks."""

import pytest
import torch

from tests.host_reads import HostReads
from tests.unit.model.test_varlen_attention import packed_batch as varlen_packed_batch
from tinytrain.model import context_parallel
from tinytrain.model.activation_checkpointing import apply_checkpointing
from tinytrain.model.compile import apply_compile
from tinytrain.model.context_parallel import ContextGroup, documents_attention
from tinytrain.model.flash_reference import use_reference_flash, varlen_attn_reference
from tinytrain.model.module import MODEL_INPUTS, CausalLMModule
from tinytrain.model.module_spec import ModuleSpec
from tinytrain.model.varlen_attention import use_varlen
from tinytrain.plan.torch_varlen import read_support

LAYERS = 3
ATOL = 1e-5  # float32 round-off; a leak across documents is ~0.1


@pytest.fixture(scope="module", params=["sdpa", "varlen", "flash"])
def core(request) -> str:
    """The attention Ulysses wraps: SDPA; torch's varlen kernel (its signature, a pure-torch kernel
    behind it); flash-attn through transformers' own flash path (the same stand-in kernel)."""
    if request.param == "varlen":
        yield use_varlen(varlen_attn_reference, read_support(varlen_attn_reference, "2.12"), "torch_varlen_reference_2.12")
        return
    if request.param == "flash":
        name = use_reference_flash()
        yield name
        # A flash core's wrapper takes the core's own name (documents_attention): give it back.
        from transformers import AttentionInterface

        AttentionInterface.register(name, context_parallel.CORE_FUNCTIONS.pop(name, AttentionInterface._global_mapping[name]))
        return
    yield "sdpa"


def tiny(attention: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    shape = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    return LlamaForCausalLM._from_config(LlamaConfig(**shape), attn_implementation=attention)


def packed_batch(rows: int = 2, seq: int = 40, seed: int = 0) -> dict:
    """Rows of several documents (position ids restarting per document), the collator's boundaries,
    the tokens as labels (test_varlen_attention.py's batch)."""
    batch = varlen_packed_batch(rows, seq, seed)
    return {**batch, "labels": batch["input_ids"]}


def training_kwargs(batch: dict) -> dict:
    """What the training forward gives the model at cp=1: the slice is the whole rows."""
    group = ContextGroup(cp=1, rank=0, group=None, micro_batch_size=batch["input_ids"].shape[0])
    return group.model_kwargs(**group.shard(batch))


def cp1_kwargs(model, batch: dict) -> dict:
    """What cp=1's training forward gives `model` (a varlen kernel: the rows flattened to one)."""
    return CausalLMModule(model, ModuleSpec(512)).model_kwargs(**{k: batch[k] for k in MODEL_INPUTS if k in batch})


def worst_vs_alone(logits: torch.Tensor, reference, batch: dict) -> float:
    worst = 0.0
    for row, positions in enumerate(batch["position_ids"]):
        starts = (positions == 0).nonzero().flatten().tolist() + [len(positions)]
        for a, b in zip(starts, starts[1:]):
            with torch.no_grad():
                alone = reference(input_ids=batch["input_ids"][row, a:b][None], use_cache=False).logits[0]
            worst = max(worst, float((logits[row, a:b] - alone).abs().max()))
    return worst


def host_reads(model, **kwargs) -> tuple[torch.Tensor, list[str]]:
    with torch.no_grad(), HostReads() as reads:
        logits = model(**kwargs).logits
    return logits, reads.ops


def test_the_training_forward_keeps_documents_apart_with_no_host_read_in_attention(core):
    model, reference = tiny(documents_attention(core)), tiny("sdpa")
    batch = packed_batch()
    given = training_kwargs(batch)
    assert given["max_length_q"] == batch["max_length"] and given["cu_seq_lens_q"].dtype == torch.int32
    # cp=1's training forward on the same kernel: transformers reads once whether the position ids
    # hold packed rows (its mask creation), and the CPU's stand-in varlen kernel reads its
    # boundaries; Ulysses' attention adds nothing to that, in any layer.
    _, own = host_reads(tiny(core), **cp1_kwargs(tiny(core), batch))
    logits, reads = host_reads(model, **given)
    assert reads == own, (reads, own)
    # Boundaries found in the position ids instead: a read in every layer, which the counter sees.
    found_logits, found = host_reads(model, input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False)
    assert len(found) >= len(own) + LAYERS, found
    assert torch.allclose(logits, found_logits, atol=ATOL, rtol=0)
    assert worst_vs_alone(logits, reference, batch) < ATOL


def test_rows_without_position_ids_are_each_one_document_without_a_host_read(core):
    model = tiny(documents_attention(core))
    ids = packed_batch()["input_ids"]
    batch = {"input_ids": ids, "labels": ids}
    given = training_kwargs(batch)
    assert given["cu_seq_lens_q"].tolist() == [0, 40, 80] and given["max_length_q"] == 40
    plain, own = host_reads(tiny(core), **cp1_kwargs(tiny(core), {"input_ids": ids, "position_ids": given["position_ids"]}))
    logits, reads = host_reads(model, **given)
    assert reads == own, (reads, own)
    assert torch.allclose(logits, plain.view_as(logits), atol=ATOL, rtol=0)  # a varlen kernel's: one flattened row


def test_a_short_batch_given_extra_rows_gets_their_documents_too(core):
    batch = packed_batch(rows=1)
    group = ContextGroup(cp=1, rank=0, group=None, micro_batch_size=3)
    local = group.shard(batch)
    assert local["input_ids"].shape[0] == 3
    documents = int(batch["cu_seq_lens"].numel()) - 1
    assert local["cu_seq_lens"].numel() - 1 == 3 * documents  # the added rows copy the first row's positions
    model = tiny(documents_attention(core))
    with torch.no_grad():
        logits = model(**group.model_kwargs(**local)).logits
        found = model(input_ids=local["input_ids"], position_ids=local["position_ids"], use_cache=False).logits
        alone = model(**training_kwargs(batch)).logits
    assert torch.allclose(logits, found, atol=ATOL, rtol=0)
    assert torch.allclose(logits[:1], alone, atol=ATOL, rtol=0)


def test_the_sdpa_mask_is_built_once_per_forward_in_compiled_selective_blocks(monkeypatch):
    """The mask is keyed on the boundaries' tensor, the one object every layer and every
    recompute is handed; compiled blocks (aot_eager) keep the gradients of eager ones."""
    builds = []
    document_ids = context_parallel._document_ids
    monkeypatch.setattr(context_parallel, "_document_ids", lambda positions: builds.append(1) or document_ids(positions))
    name = documents_attention("sdpa")
    batches = [packed_batch(seed=3), packed_batch(seed=4)]
    grads = {}
    for compiled in (False, True):
        model = tiny(name)
        apply_checkpointing(model, "selective")
        model.train()
        if compiled:
            torch._dynamo.reset()
            apply_compile(model, "blocks", "aot_eager")
        builds.clear()
        for step, batch in enumerate(batches):  # the next micro batch's boundaries build its own
            logits = model(**training_kwargs(batch)).logits
            logits.float().square().mean().backward()
            assert len(builds) == step + 1, (compiled, builds)
        grads[compiled] = [p.grad.clone() for p in model.parameters()]
    for eager, compiled in zip(grads[False], grads[True], strict=True):
        assert torch.allclose(eager, compiled, atol=1e-6, rtol=1e-5)


def windowed(arch: str, attention: str, window: int | None = 6):
    """A model whose layers attend through a sliding window of `window` keys: Mistral (every layer) or
    Qwen2 with its own layer kinds (windowed, global, windowed: each layer names its window)."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    shape = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2, use_cache=False, sliding_window=window)
    if arch == "mistral":
        return MistralForCausalLM._from_config(MistralConfig(**shape), attn_implementation=attention)
    kinds = ["sliding_attention" if window else "full_attention", "full_attention", "sliding_attention" if window else "full_attention"]
    return Qwen2ForCausalLM._from_config(Qwen2Config(**shape, use_sliding_window=window is not None, layer_types=kinds), attn_implementation=attention)


@pytest.mark.parametrize("arch", ["mistral", "qwen2"])
def test_sliding_window_layers_keep_their_window_under_ulysses_sdpa(arch):
    """Ulysses' SDPA mask was causal and per document only: a windowed layer attended to every key
    before it (Mistral's step-0 loss at cp 2 was the no-window model's). Each document of a packed
    row equals the model alone on it, its own SDPA applying the window (documents up to 40 tokens)."""
    batch = packed_batch()
    model, reference = windowed(arch, documents_attention("sdpa")), windowed(arch, "sdpa")
    with torch.no_grad():
        logits = model(**training_kwargs(batch)).logits
    assert worst_vs_alone(logits, reference, batch) < ATOL
    assert worst_vs_alone(logits, windowed(arch, "sdpa", window=None), batch) > 1e-3  # the window matters for these documents

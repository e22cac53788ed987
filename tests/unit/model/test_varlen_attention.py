"""model.attention=varlen on a CPU: tinytrain/model/varlen_attention.py's transformers attention
with flash_reference.py's pure-torch varlen kernel in place of torch's CUDA one, behind each
signature torch has shipped (2.10: is_causal only; 2.12+: window_size, enable_gqa, scale). Every
document of a packed batch, through the training forward, gives the logits transformers' own SDPA
gives it alone; padded rows, whole rows and decoding with a KV cache match SDPA too."""

import pytest
import torch

from tinytrain.data.collate import with_document_boundaries
from tinytrain.model.flash_reference import varlen_attn_2_10, varlen_attn_reference
from tinytrain.model.module import MODEL_INPUTS, CausalLMModule
from tinytrain.model.module_spec import ModuleSpec
from tinytrain.model.varlen_attention import use_varlen
from tinytrain.plan.torch_varlen import read_support

ATOL = 1e-5  # float32 round-off (~1e-7 measured); a leak across documents is ~0.1
SIGNATURES = {"torch 2.12": varlen_attn_reference, "torch 2.10": varlen_attn_2_10}


@pytest.fixture(scope="module", params=list(SIGNATURES))
def varlen(request) -> str:
    kernel = SIGNATURES[request.param]
    return use_varlen(kernel, read_support(kernel, request.param.split()[1]), f"torch_varlen_reference_{request.param.split()[1]}")


def tiny(arch: str, attention: str, window: int | None = None):
    """A 2-layer model with grouped-query heads (4 q, 2 kv); the same weights for every attention."""
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    shape = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    if arch == "mistral":
        return MistralForCausalLM._from_config(MistralConfig(**shape, sliding_window=window), attn_implementation=attention).eval()
    return LlamaForCausalLM._from_config(LlamaConfig(**shape), attn_implementation=attention).eval()


def packed_batch(micro: int, seq: int = 40, seed: int = 0) -> dict:
    """Rows of several documents each (position ids restarting per document), with the collator's boundaries."""
    g = torch.Generator().manual_seed(seed)
    positions = []
    for _ in range(micro):
        lengths, left = [], seq
        while left > 0:
            lengths.append(min(left, int(torch.randint(3, 18, (1,), generator=g))))
            left -= lengths[-1]
        positions.append(torch.cat([torch.arange(n) for n in lengths]))
    return with_document_boundaries({"input_ids": torch.randint(0, 512, (micro, seq), generator=g), "position_ids": torch.stack(positions)})


def worst_packed_vs_alone(model, reference, batch: dict) -> tuple[float, int]:
    module = CausalLMModule(model, ModuleSpec(512))
    with torch.no_grad():
        packed = module(**{k: batch[k] for k in MODEL_INPUTS if k in batch})  # the training forward
    worst, checked = 0.0, 0
    for row, positions in enumerate(batch["position_ids"]):
        starts = (positions == 0).nonzero().flatten().tolist() + [len(positions)]
        for a, b in zip(starts, starts[1:]):
            with torch.no_grad():
                alone = reference(input_ids=batch["input_ids"][row, a:b][None], use_cache=False).logits[0]
            worst, checked = max(worst, float((packed[row, a:b] - alone).abs().max())), checked + 1
    return worst, checked


@pytest.mark.parametrize("micro", [1, 3])
def test_packed_documents_equal_each_document_alone(varlen, micro):
    batch = packed_batch(micro)
    worst, checked = worst_packed_vs_alone(tiny("llama", varlen), tiny("llama", "sdpa"), batch)
    assert checked > micro  # the rows really held several documents
    assert worst < ATOL, f"micro batch {micro}: packed logits differ from each document alone by {worst:.3g}"


def test_mistral_sliding_window_packed_equals_alone():
    """A window (6) shorter than the documents: the kernel is asked for (5, 0), as SDPA's mask does it."""
    name = use_varlen(varlen_attn_reference, read_support(varlen_attn_reference, "2.12"), "torch_varlen_reference_2.12")
    batch = packed_batch(2, seq=48, seed=1)
    worst, checked = worst_packed_vs_alone(tiny("mistral", name, window=6), tiny("mistral", "sdpa", window=6), batch)
    assert checked > 3 and worst < ATOL, worst
    full, _ = worst_packed_vs_alone(tiny("mistral", name, window=6), tiny("mistral", "sdpa", window=None), batch)
    assert full > 1e-3  # the window really cut attention short


def test_a_torch_without_window_size_refuses_a_sliding_window():
    name = use_varlen(varlen_attn_2_10, read_support(varlen_attn_2_10, "2.10"), "torch_varlen_reference_2.10")
    with pytest.raises(ValueError, match="takes no window_size"):
        worst_packed_vs_alone(tiny("mistral", name, window=6), tiny("mistral", "sdpa", window=6), packed_batch(1))


def test_padded_rows_whole_rows_and_cached_decoding_match_sdpa(varlen):
    model, sdpa = tiny("llama", varlen), tiny("llama", "sdpa")
    ids = torch.randint(0, 512, (3, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[1, 8:] = 0  # right padding (SFT collate)
    mask[2, 5:] = 0
    with torch.no_grad():
        for kwargs in ({"attention_mask": mask}, {}):
            ours, theirs = (m(input_ids=ids, use_cache=False, **kwargs).logits for m in (model, sdpa))
            real = mask.bool() if kwargs else torch.ones_like(mask, dtype=torch.bool)
            assert float((ours - theirs)[real].abs().max()) < ATOL
        generated = [m.generate(ids[:1], max_new_tokens=4, do_sample=False, use_cache=True, pad_token_id=0) for m in (model, sdpa)]
    assert torch.equal(*generated)


def test_the_signature_read_from_this_torch_and_from_older_ones():
    from tinytrain.plan.torch_varlen import installed_support

    here = installed_support()
    assert here.available and here.window and here.gqa and here.scale  # torch 2.13 (CI)
    old = read_support(varlen_attn_2_10, "2.10")
    assert old.available and not old.window and not old.gqa and not old.scale
    assert "no window_size" in old.gap(sliding_window=True, softcap=False) and old.gap(False, False) is None
    assert "needs torch >= 2.10" in read_support(None, "2.9.1").gap(False, False)


def test_the_source_read_equals_the_imported_signature_and_imports_nothing():
    """installed_support() reads the signature from varlen.py's source: the same answer as
    importing the function, without pulling in torch._dynamo (~1 s of every mode=plan)."""
    import subprocess
    import sys

    from tinytrain.plan.torch_varlen import installed_support, parameters_in_source, varlen_function

    assert installed_support() == read_support(varlen_function(), installed_support().torch_version)
    probe = "import sys; from tinytrain.plan.torch_varlen import installed_support; s = installed_support(); print(s.available, 'torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "False"]
    assert parameters_in_source("def varlen_attn(q, k, *, window_size=None): ...") == ["q", "k", "window_size"]
    assert parameters_in_source("varlen_attn = other") is None  # not a plain def: the import decides


def test_this_torchs_own_kernel_takes_what_the_forward_asks_of_it():
    """torch.nn.attention.varlen.varlen_attn itself (no CUDA here: on meta tensors its shape function
    runs behind the real signature), called by the registered forward for a packed row and for
    whole rows, with grouped-query heads, a sliding window and a softmax scale."""
    from torch import nn

    from tinytrain.model.varlen_attention import varlen_forward
    from tinytrain.plan.torch_varlen import installed_support, varlen_function

    forward = varlen_forward(varlen_function(), installed_support())
    query = torch.empty(1, 4, 10, 16, device="meta", dtype=torch.bfloat16)
    key = torch.empty(1, 2, 10, 16, device="meta", dtype=torch.bfloat16)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32, device="meta")
    packed, _ = forward(nn.Module(), query, key, key, None, scaling=0.25, sliding_window=5, cu_seq_lens_q=cu, cu_seq_lens_k=cu, max_length_q=6, max_length_k=6)
    rows, _ = forward(nn.Module(), query.expand(3, -1, -1, -1), key.expand(3, -1, -1, -1), key.expand(3, -1, -1, -1), None, scaling=0.25)
    assert packed.shape == (1, 10, 4, 16) and rows.shape == (3, 10, 4, 16)


def test_under_autocast_the_kernel_gets_half_precision_queries_keys_and_values():
    """bf16-mixed on a GPU: the projections run in bf16 but RoPE's float32 cos/sin promote q and k
    back to float32, and the flash kernel takes fp16/bf16 only (found on an H100: "FlashAttention
    only support fp16 and bf16 data type"). The forward casts them as autocast casts SDPA."""
    seen = []

    def spy(q, k, v, *args, **kwargs):
        seen.append((q.dtype, k.dtype, v.dtype))
        return varlen_attn_reference(q, k, v, *args, **kwargs)

    name = use_varlen(spy, read_support(varlen_attn_reference, "2.12"), "torch_varlen_dtype_spy")
    model, batch = tiny("llama", name), packed_batch(2)
    module = CausalLMModule(model, ModuleSpec(512))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = module(**{k: batch[k] for k in MODEL_INPUTS if k in batch})
    assert seen == [(torch.bfloat16,) * 3] * 2, seen  # both layers
    with torch.no_grad():
        reference = tiny("llama", "sdpa")(input_ids=batch["input_ids"][:1, :5], use_cache=False).logits
    assert float((logits[0, :5].float() - reference[0]).abs().max()) < 0.1  # bf16 round-off, not a wrong attention
    seen.clear()
    with torch.no_grad():
        module(**{k: batch[k] for k in MODEL_INPUTS if k in batch})
    assert seen == [(torch.float32,) * 3] * 2  # no autocast: the model's own precision

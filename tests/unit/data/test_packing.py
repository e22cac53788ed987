"""Packed pretraining windows: per-document isolation checked against running each document alone
through a real tiny Llama, labels at document boundaries, and windows over a document subset."""

import numpy as np
import pytest
import torch

from tests.conftest import compose
from tinytrain.data.packing import IGNORE, PackedWindows, pack_rows
from tinytrain.data.sources import Source
from tinytrain.data.store import ensure_store

# Logits of a packed batch equal those of each document run alone to float32 round-off: measured
# ~1e-7; anything near 1e-3 would mean another document leaked into attention (that leak is ~0.2).
ATOL = 1e-5

DOCS = [
    "Alpha beta gamma delta.",
    "The quick brown fox jumps over the lazy dog, again and again and again.",
    "x",
    "def f(x):\n    return x + 1",
    "Packing puts several documents into one window without letting them see each other.",
    "Short one.",
    "Another document that is long enough to run across the end of a window into the next one, which is the interesting case.",
]


@pytest.fixture()
def store(tmp_path, bundled_tokenizer):
    (tmp_path / "corpus.txt").write_text("\n\n".join(DOCS))
    cfg = compose(["data=text", f"data.path={tmp_path / 'corpus.txt'}", f"data.cache_dir={tmp_path / 'cache'}", "data.tokenize_workers=0"]).data
    return ensure_store(Source.from_config(cfg), cfg, bundled_tokenizer, False)[0]


def tiny_llama(attention: str, vocab: int = 4096):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    return LlamaForCausalLM._from_config(config, attn_implementation=attention).eval()


def document_ids(store):
    return [store.tokens[store.offsets[d] : store.offsets[d + 1]].astype(np.int64) for d in range(store.num_documents)]


def segments(position_ids: torch.Tensor) -> list[tuple[int, int]]:
    """(start, end) of each run of position ids counting up from a restart."""
    starts = [0] + [t for t in range(1, len(position_ids)) if position_ids[t] != position_ids[t - 1] + 1]
    return list(zip(starts, starts[1:] + [len(position_ids)]))


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_logits_equal_each_document_alone(store, attention):
    from tinytrain.model.module import CausalLMModule
    from tinytrain.model.module_spec import ModuleSpec

    model = tiny_llama(attention)
    module = CausalLMModule(model, ModuleSpec(4096))
    windows = PackedWindows(store, np.arange(store.num_documents), seq_len=24)
    batch = torch.utils.data.default_collate([windows[i] for i in range(len(windows))])
    assert len(windows) >= 4 and "attention_mask" not in batch
    with torch.no_grad():
        packed = module(batch["input_ids"], position_ids=batch["position_ids"])  # the training path
        unisolated = module(batch["input_ids"])
    checked = 0
    for row in range(len(windows)):
        for a, b in segments(batch["position_ids"][row]):
            with torch.no_grad():
                alone = model(input_ids=batch["input_ids"][row, a:b][None], use_cache=False).logits[0]
            assert torch.allclose(packed[row, a:b], alone, atol=ATOL), (row, a, b, (packed[row, a:b] - alone).abs().max())
            checked += 1
    assert checked > len(windows)  # windows really held several documents
    assert (unisolated - packed).abs().max() > 1e-2  # without position ids documents would leak


def test_window_tokens_follow_the_stream_and_mask_boundary_labels(store):
    docs = document_ids(store)
    stream = np.concatenate(docs)
    doc_of = np.concatenate([np.full(len(d), i) for i, d in enumerate(docs)])
    windows = PackedWindows(store, np.arange(store.num_documents), seq_len=16)
    crossing = 0
    for i in range(len(windows)):
        w = windows[i]
        lo = i * 16
        assert w["input_ids"].tolist() == stream[lo : lo + 16].tolist()
        for t in range(16):
            boundary = doc_of[lo + t] != doc_of[lo + t + 1]
            expected = IGNORE if boundary else stream[lo + t + 1]
            assert w["labels"][t] == expected
            crossing += boundary
        # positions restart at each document start and at the window start
        for a, b in segments(w["position_ids"]):
            assert w["position_ids"][a] == 0 and (a == 0 or doc_of[lo + a] != doc_of[lo + a - 1])
    assert crossing >= 5
    eos = [t for t in range(len(stream) - 1) if doc_of[t] != doc_of[t + 1]]
    assert all(stream[t] == docs[0][-1] for t in eos)  # every boundary is an EOS -> next document


def test_predicting_across_documents_and_cross_document_attention_are_configurable(store):
    stream = np.concatenate(document_ids(store))
    across = PackedWindows(store, np.arange(store.num_documents), seq_len=16, isolate_documents=False, predict_across_documents=True)
    for i in range(len(across)):
        w = across[i]
        assert w["labels"].tolist() == stream[i * 16 + 1 : i * 16 + 17].tolist()
        assert "position_ids" not in w  # plain causal attention over the whole window


def test_windows_over_a_document_subset(store):
    docs = document_ids(store)
    chosen = np.array([1, 4, 6])
    stream = np.concatenate([docs[d] for d in chosen])
    windows = PackedWindows(store, chosen, seq_len=8)
    assert len(windows) == (len(stream) - 1) // 8
    got = np.concatenate([windows[i]["input_ids"].numpy() for i in range(len(windows))])
    assert got.tolist() == stream[: len(got)].tolist()
    with pytest.raises(IndexError):
        windows[len(windows)]


def test_pack_rows_best_fit_keeps_every_sample_once():
    lengths = [7, 3, 5, 2, 8, 1, 4, 4, 6]
    rows = pack_rows(lengths, capacity=10)
    assert sorted(i for row in rows for i in row) == list(range(len(lengths)))
    assert all(sum(lengths[i] for i in row) <= 10 for row in rows)
    assert len(rows) == 4  # 40 tokens in rows of 10: best fit reaches the minimum here

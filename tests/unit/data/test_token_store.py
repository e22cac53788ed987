"""The pretraining token store: contents, reuse, tokenizer identity, atomic builds, dtype by vocab."""

import json
import os
import select
import signal
import subprocess
import sys
import threading

import numpy as np
import pytest

from tests.conftest import REPO, SHARED_DATA, compose, needs_llama2
from tinytrain.data.datamodule import DataModule
from tinytrain.data.sources import Source
from tinytrain.data.store import TokenStore, ensure_store, token_dtype
from tinytrain.errors import ConfigError

DOCS = [f"Document {i}: " + " ".join(f"word{j}" for j in range(i % 7 + 3)) for i in range(40)]


def corpus(tmp_path, docs=DOCS):
    path = tmp_path / "corpus.txt"
    path.write_text("\n\n".join(docs))
    return path


def data_cfg(tmp_path, *overrides):
    path = corpus(tmp_path) if not (tmp_path / "corpus.txt").exists() else tmp_path / "corpus.txt"
    return compose(["data=text", f"data.path={path}", f"data.cache_dir={tmp_path / 'cache'}", "data.tokenize_workers=0", "data.seq_len=16", *overrides]).data


def store_for(cfg, tokenizer, progress=False):
    return ensure_store(Source.from_config(cfg), cfg, tokenizer, progress)


@pytest.mark.parametrize("workers", [0, 2])
def test_store_holds_every_document_then_eos(tmp_path, bundled_tokenizer, workers):
    cfg = data_cfg(tmp_path, f"data.tokenize_workers={workers}")
    store, built = store_for(cfg, bundled_tokenizer)
    assert built and store.num_documents == len(DOCS)
    assert store.tokens.dtype == np.uint16
    eos = bundled_tokenizer.eos_token_id
    for d, doc in enumerate(DOCS):
        ids = store.tokens[store.offsets[d] : store.offsets[d + 1]].tolist()
        assert ids == bundled_tokenizer(doc, add_special_tokens=False)["input_ids"] + [eos]
    meta = json.loads((store.path / "meta.json").read_text())
    assert meta["tokenizer_fingerprint"] and meta["append_eos"] is True and meta["tokenize_workers"] == workers


def test_bos_and_no_eos_policy_get_their_own_store(tmp_path, bundled_tokenizer):
    eos_store, _ = store_for(data_cfg(tmp_path), bundled_tokenizer)
    bos_store, built = store_for(data_cfg(tmp_path, "data.append_eos=false", "data.prepend_bos=true"), bundled_tokenizer)
    assert built and bos_store.path != eos_store.path
    first = bos_store.tokens[bos_store.offsets[0] : bos_store.offsets[1]].tolist()
    assert first == [bundled_tokenizer.bos_token_id] + bundled_tokenizer(DOCS[0], add_special_tokens=False)["input_ids"]


def test_reuse_hits_the_cache_without_reading_the_source(tmp_path, bundled_tokenizer, monkeypatch):
    cfg = data_cfg(tmp_path)
    store, built = store_for(cfg, bundled_tokenizer)
    mtime = (store.path / "tokens.bin").stat().st_mtime_ns

    def must_not_read(*args, **kwargs):
        raise AssertionError("a cached store was tokenized again")

    monkeypatch.setattr("tinytrain.data.sources.documents", must_not_read)
    again, built_again = store_for(cfg, bundled_tokenizer)
    assert built and not built_again and again.path == store.path
    assert (store.path / "tokens.bin").stat().st_mtime_ns == mtime


def test_changed_source_builds_a_new_store(tmp_path, bundled_tokenizer):
    cfg = data_cfg(tmp_path)
    first, _ = store_for(cfg, bundled_tokenizer)
    corpus(tmp_path, DOCS + ["one more document"])
    second, built = store_for(cfg, bundled_tokenizer)
    assert built and second.path != first.path and second.num_documents == len(DOCS) + 1


def test_a_store_built_with_another_tokenizer_is_refused(tmp_path, bundled_tokenizer):
    from tinytrain.data.tokenizer import fingerprint, load_tokenizer

    cfg = data_cfg(tmp_path)
    store, _ = store_for(cfg, bundled_tokenizer)
    other = load_tokenizer(bundled_tokenizer.name_or_path, ("<|im_start|>", "<|im_end|>"))
    # Through the cache, another tokenizer gets another store ...
    own, built = store_for(cfg, other)
    assert built and own.path != store.path
    # ... and naming this store explicitly is refused, with both fingerprints and the fix.
    explicit = data_cfg(tmp_path, f"data.store={store.path}")
    with pytest.raises(ConfigError) as e:
        DataModule(explicit, other, micro_batch_size=2, seed=0, progress=False)
    text = str(e.value)
    assert f"data.store='{store.path}'" in text
    assert fingerprint(bundled_tokenizer) in text and fingerprint(other) in text
    assert "mode=prepare" in text and "Fix:" in text
    # With its own tokenizer the explicit store is used as is.
    DataModule(explicit, bundled_tokenizer, micro_batch_size=2, seed=0, progress=False)


@needs_llama2
def test_a_store_an_older_tinytrain_built_for_the_same_tokenizer_trains_as_built(tmp_path):
    """A Llama-2 store from before the exact SentencePiece encoding: refused with "train with the
    tokenizer it was built with", the very file the run names."""
    from tinytrain.data.tokenizer import earlier_fingerprints, load_tokenizer

    tok = load_tokenizer(str(SHARED_DATA / "llama2-tokenizer" / "tokenizer.model"))
    cfg = data_cfg(tmp_path)
    store, _ = store_for(cfg, tok)
    meta_file = store.path / "meta.json"
    meta = json.loads(meta_file.read_text())
    meta_file.write_text(json.dumps({**meta, "tokenizer_fingerprint": next(iter(earlier_fingerprints(tok)))}))
    module = DataModule(data_cfg(tmp_path, f"data.store={store.path}"), tok, micro_batch_size=2, seed=0, progress=False)
    assert any("built by an older tinytrain's encoding of this tokenizer" in line for line in module.lines)
    meta_file.write_text(json.dumps({**meta, "tokenizer_fingerprint": "0000000000000000"}))
    with pytest.raises(ConfigError, match="its token ids would mean other tokens"):
        DataModule(data_cfg(tmp_path, f"data.store={store.path}"), tok, micro_batch_size=2, seed=0, progress=False)


def test_a_store_whose_tokens_changed_after_its_build_stops_at_the_window_not_in_the_model(tmp_path, bundled_tokenizer):
    """The preflight reads the store's recorded largest id: ids edited in afterwards passed it and
    indexed past the embedding (IndexError in the model; a device-side assert on a GPU)."""
    from tinytrain.data.store import TOKENS
    from tinytrain.errors import TrainingStopped

    store, _ = store_for(data_cfg(tmp_path), bundled_tokenizer)
    module = DataModule(data_cfg(tmp_path, f"data.store={store.path}"), bundled_tokenizer, micro_batch_size=2, seed=0, progress=False)
    assert module.train[0]["input_ids"].max() < len(bundled_tokenizer)
    tokens = np.memmap(store.path / TOKENS, dtype=np.dtype(store.meta["dtype"]), mode="r+")
    tokens[5] = len(bundled_tokenizer) + 7
    tokens.flush()
    module = DataModule(data_cfg(tmp_path, f"data.store={store.path}"), bundled_tokenizer, micro_batch_size=2, seed=0, progress=False)
    with pytest.raises(TrainingStopped, match=f"token id {len(bundled_tokenizer) + 7} in window 0 is not below len\\(tokenizer\\) {len(bundled_tokenizer)}.*Build the store again"):
        module.train[0]


def test_an_exception_mid_build_leaves_nothing_usable(tmp_path, bundled_tokenizer, monkeypatch):
    import tinytrain.data.store as store_module

    cfg = data_cfg(tmp_path)
    monkeypatch.setattr(store_module, "CHUNK_DOCS", 4)  # several chunks are written before the failure

    def failing_documents(src, bad, field=None):
        yield from DOCS[:20]
        raise RuntimeError("disk on fire")

    monkeypatch.setattr("tinytrain.data.sources.documents", failing_documents)
    with pytest.raises(RuntimeError, match="disk on fire"):
        store_for(cfg, bundled_tokenizer)
    stores = tmp_path / "cache" / "stores"
    assert [p.name for p in stores.iterdir() if not p.name.endswith(".lock")] == []  # no store, no temp folder
    monkeypatch.undo()
    store, built = store_for(cfg, bundled_tokenizer)
    assert built and store.num_documents == len(DOCS)


KILLED_BUILD = """
import sys, time
import tinytrain.data.store as store_module
from tests.conftest import compose
from tinytrain.data.sources import Source
from tinytrain.data.tokenizer import load_tokenizer

store_module.CHUNK_DOCS = 4
def stalling(src, bad, field=None):
    for i in range(40):
        yield f"document {i} " * 50
    print("STALLED", flush=True)
    time.sleep(600)
import tinytrain.data.sources
tinytrain.data.sources.documents = stalling
cfg = compose(["data=text", "data.path=" + sys.argv[1], "data.cache_dir=" + sys.argv[2], "data.tokenize_workers=0"]).data
tok = load_tokenizer(sys.argv[3])
store_module.ensure_store(Source.from_config(cfg), cfg, tok, False)
"""


def test_a_killed_build_leaves_no_usable_store(tmp_path, bundled_tokenizer):
    path, cache = corpus(tmp_path), tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_BUILD, str(path), str(cache), bundled_tokenizer.name_or_path],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        ready, _, _ = select.select([proc.stdout], [], [], 120)
        assert ready and proc.stdout.readline().strip() == "STALLED"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    stores = cache / "stores"
    partial = [p for p in stores.iterdir() if ".tmp-" in p.name]
    assert len(partial) == 1 and (partial[0] / "tokens.bin").stat().st_size > 0  # it was mid-write
    assert not [p for p in stores.iterdir() if p.is_dir() and ".tmp-" not in p.name]  # nothing complete
    store, built = store_for(data_cfg(tmp_path), bundled_tokenizer)
    assert built and store.num_documents == len(DOCS)
    assert not [p for p in stores.iterdir() if ".tmp-" in p.name]  # the leftover was cleared


def test_a_damaged_store_is_refused(tmp_path, bundled_tokenizer):
    store, _ = store_for(data_cfg(tmp_path), bundled_tokenizer)
    with (store.path / "tokens.bin").open("r+b") as f:
        f.truncate(10)
    with pytest.raises(ConfigError) as e:
        TokenStore.open(store.path)
    assert "damaged" in str(e.value) and "delete" in str(e.value)


@pytest.mark.parametrize(
    "damage, needle",
    [
        (lambda path, meta: (path / "meta.json").write_text("[]"), "meta.json holds a JSON list"),
        (lambda path, meta: (path / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if k != "dtype"})), "KeyError: 'dtype'"),
        (lambda path, meta: np.save(path / "doc_offsets.npy", np.array([0, "x"], dtype=object)), "doc_offsets.npy unreadable (ValueError"),
    ],
    ids=["meta a list", "no dtype", "offsets of objects"],
)
def test_a_store_with_a_malformed_record_is_named_not_a_traceback(tmp_path, bundled_tokenizer, damage, needle):
    store, _ = store_for(data_cfg(tmp_path), bundled_tokenizer)
    damage(store.path, json.loads((store.path / "meta.json").read_text()))
    with pytest.raises(ConfigError, match="delete") as e:
        TokenStore.open(store.path)
    assert needle in str(e.value)


def test_concurrent_builders_build_once(tmp_path, bundled_tokenizer):
    cfg = data_cfg(tmp_path)
    results = []
    threads = [threading.Thread(target=lambda: results.append(store_for(cfg, bundled_tokenizer))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(built for _, built in results) == [False, False, True]
    assert len({store.path for store, _ in results}) == 1


def test_dtype_follows_the_vocab():
    assert token_dtype(4096) == np.uint16
    assert token_dtype(65536) == np.uint16  # ids 0..65535
    assert token_dtype(65537) == np.uint32
    assert token_dtype(128256) == np.uint32


def test_a_vocab_over_65536_is_stored_as_uint32(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "</s>": 1, **{f"w{i}": i + 2 for i in range(70_000)}}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="</s>")
    docs = ["w0 w69999 w65536", "w65535 w12"]
    (tmp_path / "corpus.txt").write_text("\n\n".join(docs))
    store, _ = store_for(data_cfg(tmp_path, "data.tokenize_workers=1"), tok)
    assert store.tokens.dtype == np.uint32 and store.meta["dtype"] == "uint32"
    assert store.tokens[:].tolist() == [2, 70_001, 65_538, 1, 65_537, 14, 1]


@needs_llama2
def test_llama2_store_with_workers_matches_the_tokenizer(tmp_path):
    from tinytrain.data.tokenizer import load_tokenizer

    tok = load_tokenizer(str(SHARED_DATA / "llama2-tokenizer" / "tokenizer.model"))
    text = (SHARED_DATA / "tinyshakespeare.txt").read_text()[:100_000]
    blocks = [b.strip() for b in text.split("\n\n") if b.strip()]
    (tmp_path / "corpus.txt").write_text(text)
    store, _ = store_for(data_cfg(tmp_path, "data.tokenize_workers=2"), tok)
    assert store.num_documents == len(blocks)
    expected = [ids + [tok.eos_token_id] for ids in tok(blocks, add_special_tokens=False)["input_ids"]]
    assert store.tokens[:].tolist() == [t for ids in expected for t in ids]

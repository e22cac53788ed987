"""The sample index written once and memory-mapped: the same windows and batch order as the
in-memory computation, another rank maps instead of computing, DataLoader workers get paths."""

import pickle

import numpy as np
import pytest

from tests.conftest import compose
from tinytrain.data import sample_index
from tinytrain.data.datamodule import DataModule
from tinytrain.data.packing import PackedWindows
from tinytrain.data.sample_index import split_indices
from tinytrain.data.sampler import ResumableBatchSampler

DOCS = [f"Document {i}: " + " ".join(f"word{(i * j) % 97}" for j in range(i % 23 + 5)) for i in range(300)]


@pytest.fixture
def cfg(tmp_path):
    (tmp_path / "corpus.txt").write_text("\n\n".join(DOCS))
    return compose(["data=text", f"data.path={tmp_path / 'corpus.txt'}", f"data.cache_dir={tmp_path / 'cache'}", "data.tokenize_workers=0", "data.seq_len=16"]).data


def module(cfg, tokenizer, seed=3):
    return DataModule(cfg, tokenizer, micro_batch_size=4, seed=seed, progress=False)


def test_the_mapped_index_equals_the_in_memory_computation(cfg, bundled_tokenizer):
    dm = module(cfg, bundled_tokenizer)
    assert isinstance(dm.train.doc_starts, np.memmap) and isinstance(dm.train.stream_starts, np.memmap)
    store = dm.stores[0]
    train_docs, val_docs = split_indices(store.num_documents, cfg.val_fraction, 0, "documents")
    for mapped, docs in ((dm.train, train_docs), (dm.val, val_docs)):
        reference = PackedWindows(store, docs, seq_len=16)
        assert len(mapped) == len(reference) > 10
        for i in range(len(reference)):
            assert all(np.array_equal(mapped[i][k], reference[i][k]) for k in reference[i])
    plain = ResumableBatchSampler(len(dm.train), 4, 3)
    for epoch in (0, 1):
        assert dm.train_sampler.global_batches(epoch) == plain.global_batches(epoch)
    dm.train_sampler.set_shard(1, 2), plain.set_shard(1, 2)
    dm.train_sampler.load_state_dict({**plain.state_dict(), "consumed_batches": 6}), plain.load_state_dict({**plain.state_dict(), "consumed_batches": 6})
    assert list(dm.train_sampler) == list(plain)  # a resumed rank continues at the same batch


def test_another_rank_maps_what_the_first_computed(cfg, bundled_tokenizer, monkeypatch):
    first = module(cfg, bundled_tokenizer)
    batches = list(first.train_sampler)[:5]

    def must_not_compute(*args, **kwargs):
        raise AssertionError("the index was computed again instead of mapped")

    monkeypatch.setattr(sample_index, "split_indices", must_not_compute)
    monkeypatch.setattr(np.random, "default_rng", must_not_compute)
    other = module(cfg, bundled_tokenizer)
    assert list(other.train_sampler)[:5] == batches
    assert np.array_equal(other.train[7]["input_ids"], first.train[7]["input_ids"])


def test_dataloader_workers_get_file_names_not_arrays(cfg, bundled_tokenizer):
    dm = module(cfg, bundled_tokenizer)
    sent = pickle.dumps(dm.train)
    assert len(sent) < 4096 < dm.train.doc_starts.nbytes + dm.train.stream_starts.nbytes + dm.stores[0].offsets.nbytes
    again = pickle.loads(sent)
    assert isinstance(again.doc_starts, np.memmap) and np.array_equal(again[len(again) - 1]["labels"], dm.train[len(dm.train) - 1]["labels"])

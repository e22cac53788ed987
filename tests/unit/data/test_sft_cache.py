"""SFT samples tokenized once: a second DataModule (another rank, a requeued job) reads them from the
cache and tokenizes nothing; another template or seq_len policy is another cache entry."""

import json

import numpy as np

import tinytrain.data.datamodule as datamodule
from tests.conftest import compose
from tinytrain.data.datamodule import DataModule


def test_a_second_start_tokenizes_nothing_and_gets_the_same_samples(tmp_path, bundled_tokenizer, monkeypatch):
    records = [{"instruction": f"question {i}", "input": "", "output": f"answer number {i} " * (i % 5 + 1)} for i in range(40)]
    (tmp_path / "sft.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    calls = []
    real = datamodule.build_samples
    monkeypatch.setattr(datamodule, "build_samples", lambda *a, **k: calls.append(1) or real(*a, **k))

    def start(*overrides):
        cfg = compose(["data=alpaca", f"data.path={tmp_path / 'sft.jsonl'}", f"data.cache_dir={tmp_path / 'cache'}", "data.chat_template=alpaca", "data.seq_len=128", *overrides]).data
        return DataModule(cfg, bundled_tokenizer, micro_batch_size=2, seed=0, progress=False)

    first = start()
    assert len(calls) == 1 and "tokenized" in first.lines[0]
    again = start()  # another rank, or the same job requeued
    assert len(calls) == 1 and "read from the cache" in again.lines[0]
    assert len(again.train) == len(first.train) > 10
    for i in range(len(first.train)):
        assert all(np.array_equal(first.train[i][k], again.train[i][k]) for k in ("input_ids", "labels"))
    start("data.too_long=skip")  # another seq_len policy: its own samples
    start("data.train_on=all")
    assert len(calls) == 3

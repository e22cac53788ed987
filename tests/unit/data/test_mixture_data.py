"""A mixture's data: each source its own token store (or SFT samples), every batch row from the
source the sampler drew, validation drawn by weight too."""

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import compose
from tinytrain.data.datamodule import DataModule


def mixture_args(folder, entries: str, *extra) -> list[str]:
    return ["data=mixture", f"data.sources=[{entries}]", "data.seq_len=16", "data.tokenize_workers=0", f"data.cache_dir={folder / 'cache'}", *extra]


@pytest.fixture
def fruit(tmp_path):
    """Two text sources that cannot be confused: every word of one is 'apple', of the other 'banana'."""
    (tmp_path / "apples.txt").write_text("\n\n".join(" ".join(["apple"] * (8 + i % 5)) for i in range(40)))
    (tmp_path / "bananas.txt").write_text("\n\n".join(" ".join(["banana"] * (8 + i % 5)) for i in range(40)))
    return tmp_path


def test_every_row_comes_from_the_source_drawn_and_the_shares_follow_the_weights(fruit, bundled_tokenizer):
    cfg = compose(mixture_args(fruit, f"{{path: {fruit / 'apples.txt'}, weight: 1}}, {{path: {fruit / 'bananas.txt'}, weight: 3}}"))
    data = DataModule(cfg.data, bundled_tokenizer, micro_batch_size=4, seed=7)
    assert [p.name for p in data.parts] == ["apples", "bananas"] and len(data.stores) == 2
    assert all(p.item_kind == "windows" and p.tokens == p.items * 16 for p in data.parts)
    apple, banana = (set(np.unique(store.tokens).tolist()) for store in data.stores)
    shared = apple & banana
    assert shared == {bundled_tokenizer.eos_token_id}  # the sources share no other token

    def source(ids) -> str:
        tokens = set(ids.tolist()) - shared
        assert tokens <= apple or tokens <= banana, "a row mixes two sources"
        return "apples" if tokens <= apple else "bananas"

    rows = []
    for batch in data.train_dataloader():
        rows += [source(ids) for ids in batch["input_ids"]]
        data.train_sampler.advance()
    n, bananas = len(rows), rows.count("bananas")
    assert abs(bananas - 0.75 * n) <= 5 * math.sqrt(n * 0.75 * 0.25)  # binomial bound, as in test_mixture_sampler.py
    assert {source(ids) for batch in data.val_dataloader() for ids in batch["input_ids"]} == {"apples", "bananas"}
    for store, part in zip(data.stores, data.parts):  # each source's pass orders are mapped from beside its store
        assert part.orders == Path(store.path) / "index" / "orders" and len(list(part.orders.glob("order-*-epoch0.npy"))) == 2  # train and validation


def test_sft_sources_mix_instruction_records(tmp_path, bundled_tokenizer):
    for name, word in (("maths", "add"), ("poems", "rhyme")):
        records = [{"instruction": f"{word} {i}", "input": "", "output": f"{word} done {i}"} for i in range(12)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    cfg = compose(mixture_args(tmp_path, f"{{path: {tmp_path / 'maths.jsonl'}, weight: 1}}, {{path: {tmp_path / 'poems.jsonl'}, weight: 1}}", "data.format=instruction", "data.chat_template=alpaca", "data.seq_len=128"))
    data = DataModule(cfg.data, bundled_tokenizer, micro_batch_size=4, seed=0)
    assert [(p.name, p.item_kind, p.items) for p in data.parts] == [("maths", "samples", 11), ("poems", "samples", 11)]
    batch = next(iter(data.train_dataloader()))
    assert batch["input_ids"].shape[0] == 4 and (batch["labels"] != -100).any()


def test_a_source_too_small_for_one_window_is_named(fruit, bundled_tokenizer):
    (fruit / "tiny.txt").write_text("apple\n\napple\n")
    cfg = compose(mixture_args(fruit, f"{{path: {fruit / 'apples.txt'}, weight: 1}}, {{path: {fruit / 'tiny.txt'}, weight: 1}}"))
    from tinytrain.errors import ConfigError

    with pytest.raises(ConfigError, match=r"data.sources\[1\].path=.*mixture source 'tiny' yields no training windows of data.seq_len=16 tokens"):
        DataModule(cfg.data, bundled_tokenizer, micro_batch_size=4, seed=0)


def test_the_batch_stream_is_the_seeds(fruit, bundled_tokenizer):
    cfg = compose(mixture_args(fruit, f"{{path: {fruit / 'apples.txt'}, weight: 1}}, {{path: {fruit / 'bananas.txt'}, weight: 1}}"))
    first = [b for b, _ in zip(DataModule(cfg.data, bundled_tokenizer, 4, seed=3).train_sampler, range(5))]
    again = [b for b, _ in zip(DataModule(cfg.data, bundled_tokenizer, 4, seed=3).train_sampler, range(5))]
    other = [b for b, _ in zip(DataModule(cfg.data, bundled_tokenizer, 4, seed=4).train_sampler, range(5))]
    assert first == again and first != other
    assert np.unique(np.concatenate(first)).size > 4

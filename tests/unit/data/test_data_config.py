"""Data configuration: validation of data keys (all problems at once), the data module for every
format, separate validation sources, mode=prepare, and bad data reported as one paragraph."""

import json

import pytest
import torch

from tests.conftest import compose, run_cli
from tinytrain.cli import run_stages
from tinytrain.data.collate import COUNTS
from tinytrain.data.datamodule import DataModule
from tinytrain.errors import ConfigError
from tinytrain.plan.validate import validate

CHAT_TOKENS = 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]'


def problems_of(overrides):
    with pytest.raises(ConfigError) as e:
        validate(compose(overrides))
    return e.value.problems


def write_text(tmp_path, n=30, name="corpus.txt"):
    path = tmp_path / name
    path.write_text("\n\n".join(f"Document number {i} talks about topic {i % 5} at some length." for i in range(n)))
    return path


def write_chats(tmp_path, n=24, name="chat.jsonl"):
    path = tmp_path / name
    rows = [{"messages": [{"role": "user", "content": f"What is {i} plus {i}?"}, {"role": "assistant", "content": f"It is {2 * i}."}]} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_data_problems_are_reported_together(tmp_path):
    found = problems_of(["data=chat", "data.path=missing/chat.jsonl", "data.seq_len=1", "data.pad_to_multiple_of=0", "data.tokenize_workers=-1"])
    keys = sorted(p.key for p in found)
    assert keys == ["data.chat_template", "data.pad_to_multiple_of", "data.path", "data.seq_len", "data.tokenize_workers"]
    chatml = next(p for p in found if p.key == "data.chat_template")
    assert "tokenizer.add_special_tokens" in chatml.fix and "<|im_start|>" in chatml.message


def test_format_source_and_store_problems(tmp_path):
    (found,) = problems_of(["data=pydoc", "data.format=chat", CHAT_TOKENS])
    assert found.key == "data.format" and "data.source=jsonl" in found.fix
    (found,) = problems_of(["data=pydoc", f"data.store={tmp_path}"])
    assert found.key == "data.store" and "no meta.json" in found.message
    (found,) = problems_of(["data=pydoc", "data.val_path=x.txt"])
    assert found.key == "data.val_path"
    (found,) = problems_of(["data=text", f"data.path={tmp_path}"])
    assert "holds no readable shard" in found.message
    (found,) = problems_of(["data=jsonl", "data.path=./missing_dataset", "data.source=hf"])
    assert found.key == "data.path" and "no such folder" in found.message
    validate(compose(["data=jsonl", "data.path=someone/some-dataset", "data.source=hf", "mode=plan"]))  # a hub name cannot be checked offline


def test_pretraining_batches(tmp_path, bundled_tokenizer):
    cfg = compose(["data=text", f"data.path={write_text(tmp_path)}", f"data.cache_dir={tmp_path / 'cache'}", "data.seq_len=16", "data.tokenize_workers=0"]).data
    data = DataModule(cfg, bundled_tokenizer, micro_batch_size=4, seed=0, progress=False)
    batch = next(iter(data.train_dataloader()))
    assert set(batch) == {"input_ids", "labels", "position_ids", "cu_seq_lens", "max_length", COUNTS}  # boundaries for flash-attn, throughput's counts
    assert batch["input_ids"].shape == (4, 16) and batch["input_ids"].dtype == torch.long
    assert batch["cu_seq_lens"][0] == 0 and batch["cu_seq_lens"][-1] == 4 * 16 and batch["max_length"] <= 16
    assert len(data.val) >= 1 and "isolated" in data.describe()


def test_separate_validation_sources(tmp_path, bundled_tokenizer, chat_tokenizer):
    cfg = compose(["data=text", f"data.path={write_text(tmp_path)}", f"data.val_path={write_text(tmp_path, 6, 'val.txt')}", f"data.cache_dir={tmp_path / 'cache'}", "data.seq_len=16", "data.tokenize_workers=0"]).data
    data = DataModule(cfg, bundled_tokenizer, micro_batch_size=4, seed=0, progress=False)
    assert data.train.store.num_documents == 30 and data.val.store.num_documents == 6
    cfg = compose(["data=chat", f"data.path={write_chats(tmp_path)}", f"data.val_path={write_chats(tmp_path, 5, 'val.jsonl')}"]).data
    data = DataModule(cfg, chat_tokenizer, micro_batch_size=4, seed=0)
    assert (len(data.train), len(data.val)) == (24, 5)


@pytest.fixture(scope="module")
def chat_tokenizer(bundled_tokenizer):
    from tinytrain.data.tokenizer import load_tokenizer

    return load_tokenizer(bundled_tokenizer.name_or_path, ("<|im_start|>", "<|im_end|>"))


@pytest.mark.parametrize("pack", [False, True])
def test_sft_batches(tmp_path, chat_tokenizer, pack):
    cfg = compose(["data=chat", f"data.path={write_chats(tmp_path)}", f"data.pack={str(pack).lower()}", "data.seq_len=64"]).data
    data = DataModule(cfg, chat_tokenizer, micro_batch_size=2, seed=0)
    batch = next(iter(data.train_dataloader()))
    assert batch["input_ids"].shape[1] % 8 == 0
    assert ("position_ids" in batch) == pack and ("attention_mask" in batch) != pack
    assert (batch["labels"] != -100).any()


def test_sft_from_parquet_records(tmp_path, chat_tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in write_chats(tmp_path).read_text().splitlines()]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "chat.parquet")
    cfg = compose(["data=chat", "data.source=parquet", f"data.path={tmp_path / 'chat.parquet'}"]).data
    data = DataModule(cfg, chat_tokenizer, micro_batch_size=2, seed=0)
    assert len(data.train) + len(data.val) == 24


def test_too_little_data_is_a_config_error(tmp_path, bundled_tokenizer):
    base = ["data=text", f"data.cache_dir={tmp_path / 'cache'}", "data.tokenize_workers=0"]
    with pytest.raises(ConfigError, match="validation split yields no sequences of 256"):
        DataModule(compose([*base, f"data.path={write_text(tmp_path)}"]).data, bundled_tokenizer, 4, 0, progress=False)
    with pytest.raises(ConfigError, match="trainer.micro_batch_size=512"):
        DataModule(compose([*base, f"data.path={write_text(tmp_path)}", "data.seq_len=8"]).data, bundled_tokenizer, 512, 0, progress=False)
    single = tmp_path / "one.txt"
    single.write_text("just one document")
    with pytest.raises(ConfigError, match="needs at least 2"):
        DataModule(compose([*base, f"data.path={single}", "data.seq_len=4"]).data, bundled_tokenizer, 1, 0, progress=False)


def test_mode_prepare_builds_and_stops(tmp_path, capsys):
    overrides = ["mode=prepare", "data=text", f"data.path={write_text(tmp_path)}", f"data.cache_dir={tmp_path / 'cache'}", "data.seq_len=16", "data.tokenize_workers=1"]
    result = run_stages(compose(overrides), tmp_path / "run")
    out = capsys.readouterr().out
    assert "token store" in out and "built in" in out and "windows of 16" in out
    assert result.train.store.num_documents == 30
    assert not (tmp_path / "run" / "plan.json").exists()  # nothing past the data
    run_stages(compose(overrides), tmp_path / "run")
    assert "(reused)" in capsys.readouterr().out


def test_bad_data_through_the_cli_is_one_paragraph(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": "also fine"}\n{oops\n')
    r = run_cli(["mode=prepare", "data=jsonl", f"data.path={bad}", "data.text_field=text", "data.num_workers=2", f"data.cache_dir={tmp_path / 'cache'}"], tmp_path / "run")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert f"{bad}:3: not JSON" in r.stderr and "data.bad_records=skip" in r.stderr

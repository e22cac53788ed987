"""SFT: prompt masks for instruction and chat records, templates, truncation policy, padded
collation of mixed lengths, and packed vs unpacked loss on the same samples."""

import copy
import json

import numpy as np
import pytest
import torch

from tests.conftest import SHARED_DATA, compose, needs_llama2
from tinytrain.config.schema import BadRecordPolicy
from tinytrain.data.bad_records import BadRecords
from tinytrain.data.collate import PaddedCollator
from tinytrain.data.packing import PackedSamples
from tinytrain.data.sft import IGNORE, SftDataset, build_samples
from tinytrain.data.sources import Source, records
from tinytrain.data.tokenizer import load_tokenizer
from tinytrain.errors import ConfigError

CHATML = ("<|im_start|>", "<|im_end|>")
INSTRUCTIONS = [
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Name a colour.", "output": "Blue, like the sky."},
    {"instruction": "Reverse the word.", "input": "", "output": "olleh"},
]
CHATS = [
    {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."}]},
    {
        "messages": [
            {"role": "user", "content": "Hi there"},
            {"role": "assistant", "content": "Hello! How can I help?"},
            {"role": "user", "content": "Tell me a fact about lists."},
            {"role": "assistant", "content": "Python lists are mutable sequences."},
        ]
    },
]


def jsonl(tmp_path, rows, name="data.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sft_cfg(group, path, *overrides):
    return compose([f"data={group}", f"data.path={path}", *overrides]).data


def samples_of(cfg, tokenizer, policy=BadRecordPolicy.error):
    bad = BadRecords(policy)
    return build_samples(records(Source.from_config(cfg), bad), cfg, tokenizer, bad)


def trained_runs(sample) -> list[tuple[int, int]]:
    """Contiguous [start, end) token ranges that are targets of some label."""
    targets = np.zeros(len(sample.input_ids), dtype=bool)
    targets[1:] = sample.labels[:-1] != IGNORE
    runs, start = [], None
    for t, on in enumerate(list(targets) + [False]):
        if on and start is None:
            start = t
        if not on and start is not None:
            runs.append((start, t))
            start = None
    return runs


@pytest.fixture(scope="module")
def chat_tokenizer(bundled_tokenizer):
    return load_tokenizer(bundled_tokenizer.name_or_path, CHATML)


def test_instruction_mask_covers_exactly_the_prompt(tmp_path, bundled_tokenizer):
    samples, counts = samples_of(sft_cfg("alpaca", jsonl(tmp_path, INSTRUCTIONS)), bundled_tokenizer)
    assert counts.samples == 3 and counts.truncated == 0
    eos = bundled_tokenizer.eos_token
    for sample, record in zip(samples, INSTRUCTIONS):
        (start, end), = trained_runs(sample)
        assert end == len(sample.input_ids)  # the response runs to the end
        prompt = bundled_tokenizer.decode(sample.input_ids[:start])
        assert bundled_tokenizer.decode(sample.input_ids[start:]) == record["output"] + eos
        # Stanford Alpaca's prompt (tatsu-lab/stanford_alpaca train.py PROMPT_DICT), word for word.
        if record.get("input"):
            expected = (
                "Below is an instruction that describes a task, paired with an input that provides further context. "
                "Write a response that appropriately completes the request.\n\n"
                f"### Instruction:\n{record['instruction']}\n\n### Input:\n{record['input']}\n\n### Response:"
            )
        else:
            expected = (
                "Below is an instruction that describes a task. "
                "Write a response that appropriately completes the request.\n\n"
                f"### Instruction:\n{record['instruction']}\n\n### Response:"
            )
        assert prompt == expected
        # labels are the next tokens, shifted, exactly where trained
        assert sample.labels[start - 1 : end - 1].tolist() == sample.input_ids[start:end].tolist()
        assert (sample.labels[: start - 1] == IGNORE).all() and sample.labels[-1] == IGNORE


def test_chat_mask_covers_exactly_the_prompt_turns(tmp_path, chat_tokenizer):
    samples, _ = samples_of(sft_cfg("chat", jsonl(tmp_path, CHATS)), chat_tokenizer)
    for sample, record in zip(samples, CHATS):
        replies = [m["content"] for m in record["messages"] if m["role"] == "assistant"]
        runs = trained_runs(sample)
        assert [chat_tokenizer.decode(sample.input_ids[a:b]) for a, b in runs] == [r + "<|im_end|>" for r in replies]
        untrained = np.ones(len(sample.input_ids), dtype=bool)
        for a, b in runs:
            untrained[a:b] = False
        prompt_text = "".join(chat_tokenizer.decode([t]) for t in sample.input_ids[untrained])
        expected = "".join(f"<|im_start|>{m['role']}\n" + ("" if m["role"] == "assistant" else m["content"] + "<|im_end|>") + "\n" for m in record["messages"])
        assert prompt_text == expected


def test_train_on_all_trains_every_token(tmp_path, chat_tokenizer):
    samples, _ = samples_of(sft_cfg("chat", jsonl(tmp_path, CHATS), "data.train_on=all"), chat_tokenizer)
    for s in samples:
        assert s.labels[:-1].tolist() == s.input_ids[1:].tolist()


def test_tokenizer_chat_template(tmp_path, bundled_tokenizer):
    tok = copy.deepcopy(bundled_tokenizer)
    tok.chat_template = "{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}</s>\n{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
    samples, _ = samples_of(sft_cfg("chat", jsonl(tmp_path, CHATS), "data.chat_template=tokenizer"), tok)
    replies = [m["content"] for m in CHATS[1]["messages"] if m["role"] == "assistant"]
    assert [tok.decode(samples[1].input_ids[a:b]) for a, b in trained_runs(samples[1])] == [r + "</s>\n" for r in replies]
    # A template that re-renders earlier turns differently cannot be masked turn by turn.
    tok.chat_template = "{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m.content }}\n{% endfor %}"
    with pytest.raises(ConfigError, match="turn by turn"):
        samples_of(sft_cfg("chat", jsonl(tmp_path, CHATS), "data.chat_template=tokenizer"), tok)


@needs_llama2
def test_llama2_chatml_masks(tmp_path):
    tok = load_tokenizer(str(SHARED_DATA / "llama2-tokenizer" / "tokenizer.model"), CHATML)
    samples, _ = samples_of(sft_cfg("chat", jsonl(tmp_path, CHATS)), tok)
    replies = [m["content"] for m in CHATS[1]["messages"] if m["role"] == "assistant"]
    assert [tok.decode(samples[1].input_ids[a:b]) for a, b in trained_runs(samples[1])] == [r + "<|im_end|>" for r in replies]


@pytest.mark.skipif(not (SHARED_DATA / "alpaca_seed_tasks.jsonl").exists(), reason="../shared/data/alpaca_seed_tasks.jsonl absent")
def test_alpaca_seed_tasks_nested_instances(bundled_tokenizer):
    cfg = compose(["data=alpaca", "data.too_long=skip"]).data
    rows = [json.loads(line) for line in (SHARED_DATA / "alpaca_seed_tasks.jsonl").read_text().splitlines() if line.strip()]
    samples, counts = samples_of(cfg, bundled_tokenizer)
    assert counts.records == len(rows) == 175
    assert counts.samples + counts.too_long_skipped == sum(len(r["instances"]) for r in rows)
    first = rows[0]["instances"][0]
    (start, _), = trained_runs(samples[0])
    assert bundled_tokenizer.decode(samples[0].input_ids[start:]) == first["output"] + "</s>"


def test_too_long_policies(tmp_path, bundled_tokenizer):
    long = {"instruction": "Repeat.", "output": "word " * 80}
    path = jsonl(tmp_path, [*INSTRUCTIONS, long, {"instruction": "word " * 80, "output": "late"}])
    samples, counts = samples_of(sft_cfg("alpaca", path, "data.seq_len=90"), bundled_tokenizer)  # the first three fit
    assert counts.truncated == 2 and counts.nothing_to_learn == 1  # the second lost its response
    assert len(samples) == 4 and max(len(s.input_ids) for s in samples) == 90
    assert "2 truncated to 90 tokens" in counts.summary(90) and "1 skipped with no trained tokens" in counts.summary(90)
    samples, counts = samples_of(sft_cfg("alpaca", path, "data.seq_len=90", "data.too_long=skip"), bundled_tokenizer)
    assert counts.too_long_skipped == 2 and len(samples) == 3
    with pytest.raises(ConfigError) as e:
        samples_of(sft_cfg("alpaca", path, "data.seq_len=90", "data.too_long=error"), bundled_tokenizer)
    assert "data.jsonl:4" in str(e.value) and "longer than data.seq_len=90" in str(e.value)


def test_bad_sft_records(tmp_path, chat_tokenizer, bundled_tokenizer):
    rows = [INSTRUCTIONS[0], {"instruction": "No output here."}, {"instruction": "Nested.", "instances": [{"input": "a", "output": "b"}, {"input": "c"}]}]
    path = jsonl(tmp_path, rows)
    with pytest.raises(ConfigError) as e:
        samples_of(sft_cfg("alpaca", path), bundled_tokenizer)
    assert "data.jsonl:2: missing field 'output'" in str(e.value)
    samples, counts = samples_of(sft_cfg("alpaca", path), bundled_tokenizer, BadRecordPolicy.skip)
    assert len(samples) == 2 and counts.bad.counts["missing field 'output'"] == 2  # line 2, and instances[1] of line 3
    chats = [CHATS[0], {"messages": [{"role": "user", "content": "no reply"}]}, {"messages": [{"role": "robot", "content": "?"}]}, {"text": "x"}]
    samples, counts = samples_of(sft_cfg("chat", jsonl(tmp_path, chats, "chat.jsonl")), chat_tokenizer, BadRecordPolicy.skip)
    assert len(samples) == 1 and counts.bad.total == 3


def test_chatml_without_its_special_tokens_is_refused(tmp_path, bundled_tokenizer):
    with pytest.raises(ConfigError) as e:
        samples_of(sft_cfg("chat", jsonl(tmp_path, CHATS)), bundled_tokenizer)
    assert "add_special_tokens" in str(e.value) and "<|im_start|>" in str(e.value)


def test_mixed_lengths_collate_padded_to_a_multiple_of_8(tmp_path, chat_tokenizer):
    samples, _ = samples_of(sft_cfg("chat", jsonl(tmp_path, CHATS + CHATS[:1])), chat_tokenizer)
    lengths = [len(s.input_ids) for s in samples]
    assert len(set(lengths)) > 1
    loader = torch.utils.data.DataLoader(SftDataset(samples), batch_size=3, collate_fn=PaddedCollator(chat_tokenizer.pad_token_id, 8))
    batch = next(iter(loader))
    width = batch["input_ids"].shape[1]
    assert width % 8 == 0 and max(lengths) <= width < max(lengths) + 8
    assert batch["attention_mask"].sum(1).tolist() == lengths
    for row, n in enumerate(lengths):
        assert (batch["input_ids"][row, n:] == chat_tokenizer.pad_token_id).all()
        assert (batch["labels"][row, n:] == IGNORE).all()
        assert batch["labels"][row, :n].tolist() == samples[row].labels.tolist()


def test_packed_sft_gives_the_unpacked_token_weighted_loss(tmp_path, chat_tokenizer):
    from tests.unit.data.test_packing import tiny_llama
    from tinytrain.model.module import CausalLMModule
    from tinytrain.model.module_spec import ModuleSpec

    rows = CHATS * 3 + [{"messages": [{"role": "user", "content": f"Count to {n}."}, {"role": "assistant", "content": " ".join(map(str, range(n)))}]} for n in range(1, 12)]
    samples, _ = samples_of(sft_cfg("chat", jsonl(tmp_path, rows)), chat_tokenizer)
    module = CausalLMModule(tiny_llama("sdpa", vocab=len(chat_tokenizer)), ModuleSpec(len(chat_tokenizer)))
    collate = PaddedCollator(chat_tokenizer.pad_token_id, 8)
    unpacked = collate([SftDataset(samples)[i] for i in range(len(samples))])
    packed_rows = PackedSamples(samples, capacity=128)
    assert len(packed_rows) < len(samples) / 2  # really packed
    packed = collate([packed_rows[i] for i in range(len(packed_rows))])
    assert "attention_mask" not in packed
    with torch.no_grad():
        loss_unpacked = module.batch_loss(unpacked)
        loss_packed = module.batch_loss(packed)
    assert (unpacked["labels"] != IGNORE).sum() == (packed["labels"] != IGNORE).sum()
    assert torch.allclose(loss_packed, loss_unpacked, atol=1e-5), (loss_packed, loss_unpacked)


def test_a_batch_above_the_samples_a_short_seq_len_keeps_says_a_longer_one(tmp_path, bundled_tokenizer):
    # Cut at 64 tokens, all but one Alpaca seed task lose every trained token and are dropped: the
    # fix is a longer data.seq_len (a shorter one, what text windows want, drops more), and the
    # message says what the data gave.
    from tinytrain.data.datamodule import DataModule

    cfg = compose(["data=alpaca", "data.seq_len=64", f"data.cache_dir={tmp_path}"]).data
    with pytest.raises(ConfigError) as refused:
        DataModule(cfg, bundled_tokenizer, 4, 0, progress=False)
    message = str(refused.value)
    assert "is more than the 1 training sequences (sft (instruction" in message and "train tokens trained on" in message
    assert "Fix: use a smaller trainer.micro_batch_size, a longer data.seq_len (samples cut at it may keep no trained token" in message


def test_a_global_batch_above_the_training_samples_is_refused_with_the_one_that_fits(tmp_path, bundled_tokenizer):
    """An epoch is whole optimizer steps (data/sampler.py): a step needs its samples."""
    from tinytrain.data.datamodule import DataModule

    cfg = compose(["data=alpaca", f"data.cache_dir={tmp_path}"]).data
    with pytest.raises(ConfigError) as refused:
        DataModule(cfg, bundled_tokenizer, 4, 0, progress=False, data_parallel=2, samples_per_step=256)
    message = str(refused.value)
    assert "trainer.global_batch_size=256: one optimizer step takes 256 sequences (micro_batch_size 4 x data_parallel 2 x accumulation 32), more than the 150 training sequences" in message
    assert "Fix: use trainer.global_batch_size=144 or less" in message


@pytest.mark.parametrize(
    ("keys", "refused", "fix"),
    [
        # trainer.accumulate_grad_batches=32 alone: the refusal named the derived trainer.global_batch_size=256
        # and suggested trainer.global_batch_size=144, which the accumulation the user set then contradicted.
        (("trainer.accumulate_grad_batches",), "trainer.accumulate_grad_batches=32: one optimizer step takes 256 sequences", "Fix: use trainer.accumulate_grad_batches=18 or less, or more data"),
        (("trainer.global_batch_size", "trainer.accumulate_grad_batches"), "trainer.global_batch_size=256: one optimizer step", "Fix: use trainer.global_batch_size=144 trainer.accumulate_grad_batches=18 (or smaller, together), or more data"),
    ],
)
def test_a_step_above_the_training_samples_names_the_keys_the_user_set(tmp_path, bundled_tokenizer, keys, refused, fix):
    from tinytrain.data.datamodule import DataModule
    from tinytrain.data.run_data import step_keys

    assert step_keys(compose(["trainer.accumulate_grad_batches=32"]).trainer) == ("trainer.accumulate_grad_batches",)
    assert step_keys(compose([]).trainer) == ("trainer.global_batch_size",)
    cfg = compose(["data=alpaca", f"data.cache_dir={tmp_path}"]).data
    with pytest.raises(ConfigError) as refused_error:
        DataModule(cfg, bundled_tokenizer, 4, 0, progress=False, data_parallel=2, samples_per_step=256, step_keys=keys)
    message = str(refused_error.value)
    assert refused in message and fix in message, message

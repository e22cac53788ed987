"""Preference pairs: TRL's two layouts, prompt masking, chosen and rejected of a pair in one micro
batch, over-long pairs by data.too_long, bad pairs by data.bad_records, preference records under
data.format=chat, and exact resume of the pair stream."""

import json

import numpy as np
import pytest
import torch

from tests.conftest import compose
from tinytrain.config.schema import BadRecordPolicy
from tinytrain.data.bad_records import BadRecords
from tinytrain.data.datamodule import DataModule
from tinytrain.data.preference import PreferenceCollator, PreferenceDataset, build_pairs
from tinytrain.data.sources import Source, records
from tinytrain.data.tokenizer import load_tokenizer
from tinytrain.errors import ConfigError

CHATML = ("<|im_start|>", "<|im_end|>")
STRINGS = {"prompt": "Name a colour.", "chosen": "Blue, like the sky.", "rejected": "Loud."}
CONVERSATION = {
    "chosen": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "A fact?"}, {"role": "assistant", "content": "Lists are mutable."}],
    "rejected": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "A fact?"}, {"role": "assistant", "content": "No."}],
}


@pytest.fixture(scope="module")
def chatml_tokenizer(bundled_tokenizer):
    import copy

    tok = copy.deepcopy(bundled_tokenizer)
    tok.add_special_tokens({"additional_special_tokens": list(CHATML)})
    return tok


def write(tmp_path, rows, name="pairs.jsonl"):
    path = tmp_path / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def pref_cfg(path, *overrides):
    return compose(["data=jsonl", "data.format=preference", f"data.path={path}", "finetune.objective=dpo", *overrides]).data


def pairs_of(cfg, tokenizer, policy=BadRecordPolicy.error):
    bad = BadRecords(policy)
    return build_pairs(records(Source.from_config(cfg), bad), cfg, tokenizer, bad)


def answer_text(tokenizer, ids, labels) -> str:
    """The tokens some label targets (labels are shifted by one)."""
    return tokenizer.decode(ids[1:][labels[:-1] != -100])


def test_string_layout_masks_the_prompt(tmp_path, chatml_tokenizer):
    cfg = pref_cfg(write(tmp_path, [STRINGS]))
    (pair,), counts = pairs_of(cfg, chatml_tokenizer)
    assert answer_text(chatml_tokenizer, pair.chosen_ids, pair.chosen_labels) == "Blue, like the sky.<|im_end|>"
    assert answer_text(chatml_tokenizer, pair.rejected_ids, pair.rejected_labels) == "Loud.<|im_end|>"
    first = int(np.argmax(pair.chosen_labels != -100)) + 1  # the first answer token
    assert np.array_equal(pair.chosen_ids[:first], pair.rejected_ids[:first])  # one prompt, both sides
    assert "Name a colour." in chatml_tokenizer.decode(pair.chosen_ids[:first])
    assert counts.records == counts.pairs == 1


def test_conversation_layout_shares_the_prompt_and_masks_earlier_turns(tmp_path, chatml_tokenizer):
    cfg = pref_cfg(write(tmp_path, [CONVERSATION]))
    (pair,), _ = pairs_of(cfg, chatml_tokenizer)
    assert answer_text(chatml_tokenizer, pair.chosen_ids, pair.chosen_labels) == "Lists are mutable.<|im_end|>"
    assert answer_text(chatml_tokenizer, pair.rejected_ids, pair.rejected_labels) == "No.<|im_end|>"  # "Hello!" is prompt


def test_alpaca_template_and_explicit_message_prompt(tmp_path, bundled_tokenizer):
    row = {"prompt": [{"role": "user", "content": "Add 2 and 3."}], "chosen": [{"role": "assistant", "content": "5"}], "rejected": [{"role": "assistant", "content": "23"}]}
    cfg = pref_cfg(write(tmp_path, [row]), "data.chat_template=alpaca")
    (pair,), _ = pairs_of(cfg, bundled_tokenizer)
    assert answer_text(bundled_tokenizer, pair.chosen_ids, pair.chosen_labels) == "5</s>"
    assert "### Instruction:\nAdd 2 and 3." in bundled_tokenizer.decode(pair.rejected_ids)


def test_pairs_stay_together_in_a_micro_batch(tmp_path, chatml_tokenizer):
    rows = [{"prompt": f"Q{i}", "chosen": "yes " * (i + 1), "rejected": "no"} for i in range(3)]
    (p0, p1, p2), _ = pairs_of(pref_cfg(write(tmp_path, rows)), chatml_tokenizer)
    ds = PreferenceDataset([p0, p1, p2])
    ds.ref_logps = np.array([[-1.0, -2.0], [-3.0, -4.0], [-5.0, -6.0]])
    batch = PreferenceCollator(0, 8)([ds[0], ds[1], ds[2]])
    assert batch["input_ids"].shape[0] == 6 and batch["input_ids"].shape[1] % 8 == 0
    for row, ids in enumerate([p0.chosen_ids, p1.chosen_ids, p2.chosen_ids, p0.rejected_ids, p1.rejected_ids, p2.rejected_ids]):
        assert torch.equal(batch["input_ids"][row, : len(ids)], torch.from_numpy(ids))
        assert batch["attention_mask"][row].sum() == len(ids)
    assert batch["ref_logps"].tolist() == [-1.0, -3.0, -5.0, -2.0, -4.0, -6.0]  # chosen then rejected, like the rows


def test_too_long_pairs_follow_data_too_long(tmp_path, chatml_tokenizer):
    rows = [STRINGS, {"prompt": "Short.", "chosen": "word " * 40, "rejected": "No."}]
    path = write(tmp_path, rows)
    pairs, counts = pairs_of(pref_cfg(path, "data.seq_len=40"), chatml_tokenizer)
    assert len(pairs) == 2 and counts.truncated == 1 and max(len(pairs[1].chosen_ids), len(pairs[1].rejected_ids)) == 40
    pairs, counts = pairs_of(pref_cfg(path, "data.seq_len=40", "data.too_long=skip"), chatml_tokenizer)
    assert len(pairs) == 1 and counts.too_long_skipped == 1
    assert "1 skipped as longer than 40" in counts.summary(40)
    with pytest.raises(ConfigError, match="data.too_long='error'.*longer than data.seq_len=40"):
        pairs_of(pref_cfg(path, "data.seq_len=40", "data.too_long=error"), chatml_tokenizer)


def test_a_prompt_leaving_no_room_for_the_answer(tmp_path, chatml_tokenizer):
    path = write(tmp_path, [STRINGS, {"prompt": "long prompt " * 30, "chosen": "Yes.", "rejected": "No."}])
    with pytest.raises(ConfigError) as e:
        pairs_of(pref_cfg(path, "data.seq_len=32"), chatml_tokenizer)
    message = str(e.value)
    assert "pairs.jsonl:2: the prompt leaves no room for the answer" in message and "data.seq_len=32" in message and "Fix: raise data.seq_len" in message
    pairs, counts = pairs_of(pref_cfg(path, "data.seq_len=32"), chatml_tokenizer, BadRecordPolicy.skip)
    assert len(pairs) == 1 and counts.bad.counts == {"the prompt leaves no room for the answer": 1}


@pytest.mark.parametrize(
    "row, kind",
    [
        ({"prompt": "Q", "chosen": "  ", "rejected": "No."}, "empty chosen answer"),
        ({"prompt": "Q", "chosen": "Yes.", "rejected": ""}, "empty rejected answer"),
        ({"prompt": "Q", "chosen": "Same.", "rejected": "Same."}, "chosen and rejected are identical"),
        ({"chosen": CONVERSATION["chosen"], "rejected": CONVERSATION["chosen"]}, "chosen and rejected are identical"),
        ({"prompt": "Q", "chosen": "Yes."}, "missing field 'rejected'"),
    ],
)
def test_bad_pairs_stop_or_are_counted(tmp_path, chatml_tokenizer, row, kind):
    path = write(tmp_path, [STRINGS, row])
    with pytest.raises(ConfigError) as e:
        pairs_of(pref_cfg(path), chatml_tokenizer)
    assert f"data.path='{path}:2'" in str(e.value) and kind in str(e.value) and "data.bad_records=skip" in str(e.value)
    pairs, counts = pairs_of(pref_cfg(path), chatml_tokenizer, BadRecordPolicy.skip)
    assert len(pairs) == 1 and counts.bad.counts == {kind: 1}
    assert f"skipped 1 bad records: 1 {kind}" in counts.summary(256)


def test_preference_records_under_format_chat_are_refused(tmp_path, chatml_tokenizer):
    from tinytrain.data.sft import build_samples

    path = write(tmp_path, [STRINGS])
    cfg = compose(["data=chat", f"data.path={path}", "data.bad_records=skip"]).data  # even when skipping
    bad = BadRecords(cfg.bad_records)
    with pytest.raises(ConfigError, match=r"data.format='chat': .*pairs.jsonl:1 is a preference pair .* Fix: set data.format=preference"):
        build_samples(records(Source.from_config(cfg), bad), cfg, chatml_tokenizer, bad)


def test_the_pair_stream_resumes_exactly(tmp_path, monkeypatch):
    """Batches after a saved sampler position equal the uninterrupted run's, pairs intact; the pairs
    are tokenized by the first start only: the others (other ranks, a requeued job) read the cache."""
    tok = load_tokenizer(str(compose([]).tokenizer.path))
    rows = [{"prompt": f"Question {i}?", "chosen": "answer " * (1 + i % 5), "rejected": f"no {i}"} for i in range(40)]
    cfg = pref_cfg(write(tmp_path, rows), "data.chat_template=alpaca", "data.val_fraction=0.1", f"data.cache_dir={tmp_path / 'cache'}")
    calls = []
    real_call = type(tok).__call__
    monkeypatch.setattr(type(tok), "__call__", lambda self, *a, **k: calls.append(1) or real_call(self, *a, **k))

    def loader_batches(data, n):
        it = iter(data.train_dataloader())
        out = []
        for _ in range(n):
            out.append(next(it)["input_ids"])
            data.train_sampler.advance()
        return out

    straight = DataModule(cfg, tok, micro_batch_size=4, seed=7, progress=False)
    assert calls and "tokenized" in straight.lines[0]
    calls.clear()
    uninterrupted = loader_batches(straight, 6)
    first = DataModule(cfg, tok, micro_batch_size=4, seed=7, progress=False)
    assert not calls and "read from the cache" in first.lines[0]
    loader_batches(first, 4)
    resumed = DataModule(cfg, tok, micro_batch_size=4, seed=7, progress=False)
    resumed.train_sampler.load_state_dict(first.train_sampler.state_dict())
    later = loader_batches(resumed, 2)
    assert not calls  # cached pairs, the same batches as the tokenized ones
    assert all(torch.equal(a, b) for a, b in zip(later, uninterrupted[4:]))
    DataModule(pref_cfg(cfg.path, "data.chat_template=alpaca", "data.too_long=skip", f"data.cache_dir={tmp_path / 'cache'}"), tok, micro_batch_size=4, seed=7, progress=False)
    assert calls  # another data.too_long: its own pairs
    assert all(b.shape[0] == 8 for b in uninterrupted)  # 4 pairs = 8 rows


CHATML_JINJA = "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


def test_chatml_pairs_have_trls_ids_but_leave_the_newline_after_im_end_unscored(tmp_path, chatml_tokenizer):
    """The difference docs/finetuning.md names beside "TRL's layout": on the same ChatML pair TRL 1.16's
    token ids are tinytrain's, but TRL scores everything after the generation prompt, the "\\n" after
    <|im_end|> included, and tinytrain leaves that newline unscored (template glue after the stop
    token, which generation never predicts; SFT masks it alike). Log-prob sums differ by its log-prob."""
    import copy

    from trl.data_utils import apply_chat_template

    tok = copy.deepcopy(chatml_tokenizer)
    tok.chat_template = CHATML_JINJA
    (pair,), _ = pairs_of(pref_cfg(write(tmp_path, [STRINGS]), "data.chat_template=chatml"), tok)
    example = apply_chat_template({"prompt": [{"role": "user", "content": STRINGS["prompt"]}], "chosen": [{"role": "assistant", "content": STRINGS["chosen"]}], "rejected": [{"role": "assistant", "content": STRINGS["rejected"]}]}, tok)
    for ids, labels, answer in ((pair.chosen_ids, pair.chosen_labels, example["chosen"]), (pair.rejected_ids, pair.rejected_labels, example["rejected"])):
        prompt_ids = tok(example["prompt"], add_special_tokens=False)["input_ids"]
        answer_ids = tok(answer, add_special_tokens=False)["input_ids"]
        assert ids.tolist() == prompt_ids + answer_ids  # the same tokens
        trl_scored = ids[len(prompt_ids) :].tolist()
        ours = ids[1:][labels[:-1] != -100].tolist()
        assert trl_scored[:-1] == ours and tok.decode(trl_scored[-1:]) == "\n"  # all but TRL's last token

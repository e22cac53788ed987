"""Unpaired preference records for finetune.objective=kto: TRL's unpaired layout, read by the same
data.format=preference.

  {"prompt": "...", "completion": "...", "label": true}    strings (prompt as a user turn), or the
                                                           prompt as a list of messages and the
                                                           completion as assistant messages

`label` says whether the completion is desirable. Each example is one sequence with only the
completion's tokens labelled; a micro batch of B examples is 2B rows: the B examples, then their B KL
rows, each example's prompt followed by the previous example's completion (cycled within the micro
batch, as TRL's collator builds the mismatched pairs its KL estimate is taken on).

A record without a label, or whose label is not true/false, is a bad record (data.bad_records); a
source whose examples are all one label cannot train KTO and stops with the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import Dataset

from tinytrain.data.bad_records import BadRecords
from tinytrain.data.collate import PaddedCollator
from tinytrain.data.preference import NO_ROOM_FIX, _encode, _messages, _rendered
from tinytrain.data.sft import IGNORE, check_masking_tokenizer, shifted_labels, trained_mask
from tinytrain.errors import ConfigError, Problem

UNPAIRED_KEYS = ("completion", "label")


def is_unpaired(record) -> bool:
    """TRL's unpaired layout ({prompt, completion, label}) rather than a pair."""
    return isinstance(record, dict) and any(k in record for k in UNPAIRED_KEYS) and "chosen" not in record


@dataclass
class UnpairedExample:
    ids: np.ndarray  # int64
    labels: np.ndarray  # shifted, -100 outside the completion
    prompt_tokens: int  # ids[:prompt_tokens] is the prompt, the rest the completion
    desirable: bool

    @property
    def length(self) -> int:
        return len(self.ids)


def split_unpaired(record: dict, where: str, bad: BadRecords) -> tuple[list[dict], list[dict], bool] | None:
    if "label" not in record or record["label"] is None:
        bad.report(where, "missing field 'label'", "KTO records are {prompt, completion, label: true|false}")
        return None
    if not isinstance(record["label"], bool):
        bad.report(where, "field 'label' is not true or false", repr(record["label"])[:40])
        return None
    prompt, completion = record.get("prompt"), record.get("completion")
    if prompt is None or completion is None:
        bad.report(where, f"missing field '{'prompt' if prompt is None else 'completion'}'", f"fields: {', '.join(record)}")
        return None
    prompt_msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else _messages(prompt, "prompt", where, bad)
    answer = [{"role": "assistant", "content": completion}] if isinstance(completion, str) else _messages(completion, "completion", where, bad)
    if prompt_msgs is None or answer is None:
        return None
    if any(m["role"] != "assistant" for m in answer) or not any(m["content"].strip() for m in answer):
        bad.report(where, "the completion is not a non-empty assistant answer", repr(answer)[:80])
        return None
    return prompt_msgs, answer, record["label"]


def build_unpaired(records, data_cfg, tokenizer, bad: BadRecords, where_key: str, path) -> tuple[list[UnpairedExample], str]:
    """`records` yields (record, location) pairs; over-long examples are cut to data.seq_len."""
    check_masking_tokenizer(data_cfg, tokenizer, "preference")
    pending = []
    count = 0
    for record, where in records:
        count += 1
        split = split_unpaired(record, where, bad) if isinstance(record, dict) else bad.report(where, "not a JSON object")
        if split:
            prompt_msgs, answer, label = split
            pending.append((*_rendered(prompt_msgs, answer, data_cfg.chat_template, tokenizer), label, where))
    out = []
    if pending:
        ids_list, offsets = _encode([p[0] for p in pending], tokenizer)
        for (_, spans, label, where), ids, offs in zip(pending, ids_list, offsets):
            ids, trained = np.asarray(ids, dtype=np.int64), trained_mask(offs, spans)
            if data_cfg.prepend_bos:
                ids, trained = np.concatenate([[tokenizer.bos_token_id], ids]), np.concatenate([[False], trained])
            prompt_tokens = int(np.argmax(trained)) if trained.any() else len(ids)
            if prompt_tokens >= data_cfg.seq_len:
                bad.report(where, "the prompt leaves no room for the completion", f"{prompt_tokens} prompt tokens, data.seq_len={data_cfg.seq_len}", NO_ROOM_FIX)
                continue
            ids, trained = ids[: data_cfg.seq_len], trained[: data_cfg.seq_len]
            out.append(UnpairedExample(ids, shifted_labels(ids, trained), prompt_tokens, label))
    desirable = sum(e.desirable for e in out)
    if out and desirable in (0, len(out)):
        one = "true (desirable)" if desirable else "false (undesirable)"
        raise ConfigError(Problem(where_key, path, f"all {len(out)} KTO examples are label={one}: KTO weighs desirable against undesirable completions and its KL estimate needs both", "add records of the other label (TRL's unpaired layout {prompt, completion, label}), or train on pairs with finetune.objective=dpo"))
    return out, f"{count} records -> {len(out)} KTO examples ({desirable} desirable, {len(out) - desirable} undesirable)"


class UnpairedDataset(Dataset):
    def __init__(self, examples: list[UnpairedExample]):
        self.examples = examples
        self.lengths = [e.length for e in examples]

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, i: int) -> UnpairedExample:
        return self.examples[i]


class UnpairedCollator:
    """B examples as 2B rows: the examples, then the KL rows (prompt i + completion i-1), padded
    together; `kto_labels` (B,) says which are desirable."""

    def __init__(self, pad_id: int, multiple: int = 8, seq_len: int = 0):
        self.padded = PaddedCollator(pad_id, multiple)
        self.seq_len = seq_len

    def __call__(self, items: list[UnpairedExample]) -> dict:
        rows = [{"input_ids": torch.from_numpy(e.ids), "labels": torch.from_numpy(e.labels)} for e in items]
        for e, prev in zip(items, items[-1:] + items[:-1]):
            ids = np.concatenate([e.ids[: e.prompt_tokens], prev.ids[prev.prompt_tokens :]])
            trained = np.concatenate([np.zeros(e.prompt_tokens, dtype=bool), np.ones(len(prev.ids) - prev.prompt_tokens, dtype=bool)])
            trained[e.prompt_tokens :] = prev.labels[prev.prompt_tokens - 1 : len(prev.ids) - 1] != IGNORE  # the completion's scored tokens
            if self.seq_len:
                ids, trained = ids[: self.seq_len], trained[: self.seq_len]
            rows.append({"input_ids": torch.from_numpy(ids), "labels": torch.from_numpy(shifted_labels(ids, trained))})
        batch = self.padded(rows)
        batch["kto_labels"] = torch.tensor([e.desirable for e in items])
        return batch

"""Supervised fine-tuning samples: records -> conversations -> chat template -> token ids with every
prompt token masked (-100), over-long samples truncated, skipped or refused (data.too_long), counted.

Instruction records: `instruction`, optional `input`, `output`; or Alpaca's seed-task layout with
`instances: [{input, output}, ...]` (one sample per instance). Chat records: `messages`, a list of
{role: system|user|assistant, content} with at least one assistant turn.

Which tokens are trained on comes from character spans (chat_templates.py) mapped through the fast
tokenizer's offsets: a token is trained on when its first character lies in an assistant span.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import Dataset

from tinytrain.config.schema import DataFormat, TooLongPolicy, TrainOn
from tinytrain.data.bad_records import BadRecords
from tinytrain.data.chat_templates import ROLES, render, template_problems
from tinytrain.errors import ConfigError, Problem, raise_if_any

log = logging.getLogger(__name__)

IGNORE = -100
TOKENIZE_BATCH = 1024


@dataclass
class SftSample:
    input_ids: np.ndarray  # int64
    labels: np.ndarray  # shifted: labels[t] = input_ids[t+1] if that token is trained on, else -100


@dataclass
class SftCounts:
    records: int = 0
    samples: int = 0
    truncated: int = 0
    too_long_skipped: int = 0
    shortest_skipped: int | None = None  # tokens of the shortest sample data.too_long=skip dropped
    nothing_to_learn: int = 0  # no trained-on token left (e.g. truncated before the response)
    empty_responses: int = 0  # conversations whose assistant turns are all blank
    bad: BadRecords | None = field(default=None, repr=False)

    def summary(self, seq_len: int) -> str:
        bad = f"; {self.bad.summary()}" if self.bad is not None and self.bad.total else ""
        return (
            f"{self.records} records -> {self.samples} samples ({self.truncated} truncated to {seq_len} tokens, "
            f"{self.too_long_skipped} skipped as longer than {seq_len}, {self.nothing_to_learn} skipped with no trained tokens{bad})"
        )


def no_samples_fix(counts: SftCounts) -> str:
    """The fix for a source that gave no sample, by what removed them."""
    if counts.too_long_skipped and counts.too_long_skipped >= counts.nothing_to_learn:
        return (
            f"raise data.seq_len (the shortest sample skipped has {counts.shortest_skipped} tokens: data.seq_len={counts.shortest_skipped} keeps it), "
            "or set data.too_long=truncate to keep the start of each sample"
        )
    if counts.nothing_to_learn:
        return "raise data.seq_len so responses fit after their prompts, or use data.train_on=all"
    return "check data.format and the records"


def conversations(record: dict, where: str, fmt: DataFormat, bad: BadRecords) -> list[list[dict]]:
    """The conversations one record holds ([] when it is bad and skipped)."""
    if isinstance(record, dict) and "chosen" in record and "rejected" in record:
        # Whatever data.bad_records says: every record of such a file would be dropped.
        raise ConfigError(
            Problem("data.format", fmt.value, f"{where} is a preference pair (chosen/rejected), not a {fmt.value} record", "set data.format=preference and finetune.objective=dpo (or ipo, simpo)")
        )
    if fmt == DataFormat.chat:
        return _chat(record, where, bad)
    return _instruction(record, where, bad)


def _text_field(record: dict, name: str, where: str, bad: BadRecords, required: bool = True) -> str | None:
    value = record.get(name)
    if value is None:
        if not required:
            return ""
        bad.report(where, f"missing field '{name}'", f"fields: {', '.join(record) or 'none'}")
        return None
    if not isinstance(value, str):
        bad.report(where, f"field '{name}' is not a string", type(value).__name__)
        return None
    return value


def _instruction(record: dict, where: str, bad: BadRecords) -> list[list[dict]]:
    instruction = _text_field(record, "instruction", where, bad)
    if instruction is None:
        return []
    if "instances" in record:
        instances = record["instances"]
        if not isinstance(instances, list) or not all(isinstance(i, dict) for i in instances):
            bad.report(where, "field 'instances' is not a list of objects")
            return []
    else:
        instances = [record]
    result = []
    for n, inst in enumerate(instances):
        at = where if inst is record else f"{where} instances[{n}]"
        given = _text_field(inst, "input", at, bad, required=False)
        output = _text_field(inst, "output", at, bad)
        if given is None or output is None:
            continue
        # Alpaca renders instruction and input in their own sections (the `input` key); other
        # templates see them joined in the user message.
        if given.strip():
            user = {"role": "user", "content": instruction, "input": given}
        else:
            user = {"role": "user", "content": instruction}
        result.append([user, {"role": "assistant", "content": output}])
    return result


def _chat(record: dict, where: str, bad: BadRecords) -> list[list[dict]]:
    messages = record.get("messages")
    if messages is None:
        bad.report(where, "missing field 'messages'", f"fields: {', '.join(record) or 'none'}")
        return []
    if not isinstance(messages, list) or not messages:
        bad.report(where, "field 'messages' is not a non-empty list")
        return []
    for n, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            bad.report(where, f"messages[{n}] is not {{role: {'|'.join(ROLES)}, content: string}}", repr(m)[:80])
            return []
    if not any(m["role"] == "assistant" for m in messages):
        bad.report(where, "no assistant message", "nothing to train on")
        return []
    return [[{"role": m["role"], "content": m["content"]} for m in messages]]


def trained_mask(offsets: list[tuple[int, int]], spans: list[tuple[int, int]]) -> np.ndarray:
    starts = np.fromiter((a for a, _ in offsets), dtype=np.int64, count=len(offsets))
    mask = np.zeros(len(offsets), dtype=bool)
    for a, b in spans:
        mask |= (starts >= a) & (starts < b)
    return mask


def shifted_labels(ids: np.ndarray, trained: np.ndarray) -> np.ndarray:
    labels = np.full(len(ids), IGNORE, dtype=np.int64)
    labels[:-1] = np.where(trained[1:], ids[1:], IGNORE)
    return labels


def check_masking_tokenizer(data_cfg, tokenizer, what: str) -> None:
    """The chat template renders with this tokenizer, and the tokenizer is fast: answers are masked
    by character offsets (SFT samples and preference pairs alike)."""
    raise_if_any(template_problems(data_cfg.chat_template, tokenizer))
    if not getattr(tokenizer, "is_fast", False):
        raise ConfigError(Problem("tokenizer.path", str(tokenizer.name_or_path), f"{what} masking needs a fast tokenizer (character offsets)", "use a tokenizer with a tokenizer.json"))


def build_samples(records, data_cfg, tokenizer, bad: BadRecords) -> tuple[list[SftSample], SftCounts]:
    """`records` yields (record, location) pairs (sources.records)."""
    check_masking_tokenizer(data_cfg, tokenizer, "SFT")
    counts = SftCounts(bad=bad)
    samples: list[SftSample] = []
    pending: list[tuple[str, list, str]] = []  # (text, spans, location)
    for record, where in records:
        counts.records += 1
        for convo in conversations(record, where, data_cfg.format, bad):
            if not any(m["content"].strip() for m in convo if m["role"] == "assistant"):
                counts.empty_responses += 1
            pending.append((*render(convo, data_cfg.chat_template, tokenizer), where))
            if len(pending) >= TOKENIZE_BATCH:
                samples += _tokenize(pending, data_cfg, tokenizer, counts)
                pending = []
    samples += _tokenize(pending, data_cfg, tokenizer, counts)
    counts.samples = len(samples)
    raise_if_any(empty_response_problems(counts, data_cfg))
    return samples, counts


# Above this share of blank responses a run would learn to end every answer at once.
MAX_EMPTY_RESPONSE_SHARE = 0.5


def empty_response_problems(counts: SftCounts, data_cfg) -> list[Problem]:
    conversations_seen = counts.samples + counts.nothing_to_learn + counts.too_long_skipped
    if data_cfg.train_on != TrainOn.assistant or not conversations_seen or counts.empty_responses <= MAX_EMPTY_RESPONSE_SHARE * conversations_seen:
        return []
    return [
        Problem(
            "data.path",
            data_cfg.path,
            f"{counts.empty_responses} of {conversations_seen} examples have an empty response: training on them teaches the model to answer with nothing",
            "fill in the responses (the 'output' field, or the assistant messages' content), or remove those records",
        )
    ]


def _tokenize(pending: list, data_cfg, tokenizer, counts: SftCounts) -> list[SftSample]:
    if not pending:
        return []
    enc = tokenizer([text for text, _, _ in pending], add_special_tokens=False, return_offsets_mapping=True)
    out = []
    seq_len = data_cfg.seq_len
    for (_, spans, where), ids, offsets in zip(pending, enc["input_ids"], enc["offset_mapping"]):
        ids = np.asarray(ids, dtype=np.int64)
        trained = trained_mask(offsets, spans) if data_cfg.train_on == TrainOn.assistant else np.ones(len(ids), dtype=bool)
        if data_cfg.prepend_bos:
            ids, trained = np.concatenate([[tokenizer.bos_token_id], ids]), np.concatenate([[False], trained])
        if len(ids) > seq_len:
            if data_cfg.too_long == TooLongPolicy.error:
                raise ConfigError(
                    Problem("data.too_long", "error", f"{where}: a sample of {len(ids)} tokens is longer than data.seq_len={seq_len}", "raise data.seq_len, or set data.too_long=truncate or skip")
                )
            if data_cfg.too_long == TooLongPolicy.skip:
                counts.too_long_skipped += 1
                counts.shortest_skipped = min(len(ids), counts.shortest_skipped or len(ids))
                continue
            ids, trained = ids[:seq_len], trained[:seq_len]
            counts.truncated += 1
        labels = shifted_labels(ids, trained)
        if not (labels != IGNORE).any():
            counts.nothing_to_learn += 1
            continue
        out.append(SftSample(ids, labels))
    return out


def trained_tokens(samples) -> np.ndarray:
    """Each sample's trained tokens (labels not -100): a step's loss is the mean over all of its
    own (train/callbacks/step_tokens.py), and the data line counts them."""
    return np.array([int((s.labels != IGNORE).sum()) for s in samples], dtype=np.int64)


class SftDataset(Dataset):
    """Unpacked samples, one per item; PaddedCollator pads a batch of them."""

    def __init__(self, samples: list[SftSample]):
        self.samples = samples
        self.lengths = [len(s.input_ids) for s in samples]
        self.labelled = trained_tokens(samples)  # per item (StepTokens)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> dict:
        s = self.samples[i]
        return {"input_ids": torch.from_numpy(s.input_ids), "labels": torch.from_numpy(s.labels)}

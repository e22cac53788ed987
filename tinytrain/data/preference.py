"""Preference pairs (data.format=preference): records -> a prompt with a chosen and a rejected
answer -> two token sequences that share the prompt, each with only its answer's tokens labelled.

TRL's two layouts are read:
  {"prompt": "...", "chosen": "...", "rejected": "..."}                 strings, rendered through
                                                                         data.chat_template as a user
                                                                         turn and an assistant answer
  {"chosen": [messages], "rejected": [messages]}                        conversations sharing their
                                                                         first messages (the prompt);
                                                                         what follows is the answer
(an explicit `prompt` may also be a list of messages). Every prompt token, earlier assistant turns
included, is masked (-100): a pair is scored on its answers only.

Over-long sequences follow data.too_long as SFT samples do (truncate keeps the start, skip drops the
pair, error stops); a pair whose prompt leaves no room for an answer within data.seq_len, an empty
answer, or identical answers are bad records (data.bad_records: stop with the record named, or skip
and count).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch.utils.data import Dataset

from tinytrain.config.schema import TooLongPolicy
from tinytrain.data.bad_records import BadRecords
from tinytrain.data.chat_templates import ROLES, render
from tinytrain.data.collate import PaddedCollator
from tinytrain.data.sft import IGNORE, check_masking_tokenizer, shifted_labels, trained_mask
from tinytrain.errors import ConfigError, Problem

TOKENIZE_BATCH = 512
NO_ROOM_FIX = "raise data.seq_len or shorten the prompt (data.too_long=skip drops such pairs as too long)"


@dataclass
class PreferencePair:
    chosen_ids: np.ndarray  # int64
    chosen_labels: np.ndarray  # shifted, -100 outside the chosen answer
    rejected_ids: np.ndarray
    rejected_labels: np.ndarray

    @property
    def length(self) -> int:
        return max(len(self.chosen_ids), len(self.rejected_ids))


@dataclass
class PreferenceCounts:
    records: int = 0
    pairs: int = 0
    truncated: int = 0  # pairs with a side cut to seq_len
    too_long_skipped: int = 0
    longest_skipped: int = 0  # tokens of the longest pair data.too_long=skip dropped
    bad: BadRecords | None = field(default=None, repr=False)

    def summary(self, seq_len: int) -> str:
        bad = f"; {self.bad.summary()}" if self.bad is not None and self.bad.total else ""
        return f"{self.records} records -> {self.pairs} pairs ({self.truncated} truncated to {seq_len} tokens, {self.too_long_skipped} skipped as longer than {seq_len}{bad})"


def no_pairs_fix(counts: PreferenceCounts, seq_len: int) -> str:
    """The fix for a source that gave no pair, by what removed them."""
    if counts.too_long_skipped:
        return (
            f"raise data.seq_len (now {seq_len}; the longest pair skipped has {counts.longest_skipped} tokens: data.seq_len={counts.longest_skipped} keeps every pair), "
            "or set data.too_long=truncate to keep the start of each pair"
        )
    return "check data.format and the records"


def _messages(value, name: str, where: str, bad: BadRecords) -> list[dict] | None:
    if not isinstance(value, list) or not value:
        bad.report(where, f"field '{name}' is not a string or a non-empty list of messages")
        return None
    for n, m in enumerate(value):
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            bad.report(where, f"{name}[{n}] is not {{role: {'|'.join(ROLES)}, content: string}}", repr(m)[:80])
            return None
    return [{"role": m["role"], "content": m["content"]} for m in value]


def split_pair(record: dict, where: str, bad: BadRecords) -> tuple[list[dict], list[dict], list[dict]] | None:
    """(prompt messages, chosen answer messages, rejected answer messages), or None when bad."""
    chosen, rejected, prompt = record.get("chosen"), record.get("rejected"), record.get("prompt")
    missing = [k for k in ("chosen", "rejected") if record.get(k) is None]
    if missing:
        bad.report(where, f"missing field '{missing[0]}'", f"fields: {', '.join(record) or 'none'}")
        return None
    if isinstance(prompt, str):
        prompt_msgs = [{"role": "user", "content": prompt}]
    elif prompt is None:
        prompt_msgs = None
    else:
        prompt_msgs = _messages(prompt, "prompt", where, bad)
        if prompt_msgs is None:
            return None
    answers = []
    for name, value in (("chosen", chosen), ("rejected", rejected)):
        if isinstance(value, str):
            answers.append([{"role": "assistant", "content": value}])
        else:
            msgs = _messages(value, name, where, bad)
            if msgs is None:
                return None
            answers.append(msgs)
    chosen_msgs, rejected_msgs = answers
    if prompt_msgs is None:
        # TRL's implicit prompt: the messages both conversations start with.
        shared = 0
        while shared < min(len(chosen_msgs), len(rejected_msgs)) and chosen_msgs[shared] == rejected_msgs[shared]:
            shared += 1
        if chosen_msgs == rejected_msgs:
            bad.report(where, "chosen and rejected are identical", "a pair teaches nothing when both answers are the same")
            return None
        if shared == 0:
            bad.report(where, "no prompt: chosen and rejected share no first message", "add a 'prompt' field, or start both conversations with the same messages")
            return None
        prompt_msgs, chosen_msgs, rejected_msgs = chosen_msgs[:shared], chosen_msgs[shared:], rejected_msgs[shared:]
    for name, msgs in (("chosen", chosen_msgs), ("rejected", rejected_msgs)):
        if not msgs or any(m["role"] != "assistant" for m in msgs):
            bad.report(where, f"the {name} answer is not assistant messages", repr(msgs)[:80])
            return None
        if not any(m["content"].strip() for m in msgs):
            bad.report(where, f"empty {name} answer", "a preference pair needs two non-blank answers")
            return None
    if chosen_msgs == rejected_msgs:
        bad.report(where, "chosen and rejected are identical", "a pair teaches nothing when both answers are the same")
        return None
    return prompt_msgs, chosen_msgs, rejected_msgs


def _rendered(prompt_msgs: list[dict], answer: list[dict], template, tokenizer) -> tuple[str, list]:
    """The conversation's text and the character spans of the answer's messages only (assistant
    turns inside the prompt are masked like the rest of it)."""
    text, spans = render(prompt_msgs + answer, template, tokenizer)
    return text, spans[len(spans) - len(answer) :]


def build_pairs(records, data_cfg, tokenizer, bad: BadRecords) -> tuple[list[PreferencePair], PreferenceCounts]:
    """`records` yields (record, location) pairs (sources.records)."""
    check_masking_tokenizer(data_cfg, tokenizer, "preference")
    counts = PreferenceCounts(bad=bad)
    pairs: list[PreferencePair] = []
    pending: list[tuple] = []  # (chosen text, spans, rejected text, spans, location)
    for record, where in records:
        counts.records += 1
        if not isinstance(record, dict):
            bad.report(where, "not a JSON object")
            continue
        split = split_pair(record, where, bad)
        if split is None:
            continue
        prompt_msgs, chosen, rejected = split
        pending.append((*_rendered(prompt_msgs, chosen, data_cfg.chat_template, tokenizer), *_rendered(prompt_msgs, rejected, data_cfg.chat_template, tokenizer), where))
        if len(pending) >= TOKENIZE_BATCH:
            pairs += _tokenize(pending, data_cfg, tokenizer, counts, bad)
            pending = []
    pairs += _tokenize(pending, data_cfg, tokenizer, counts, bad)
    counts.pairs = len(pairs)
    return pairs, counts


def _encode(texts: list[str], tokenizer):
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    return enc["input_ids"], enc["offset_mapping"]


def _tokenize(pending: list, data_cfg, tokenizer, counts: PreferenceCounts, bad: BadRecords) -> list[PreferencePair]:
    if not pending:
        return []
    chosen_ids, chosen_offsets = _encode([p[0] for p in pending], tokenizer)
    rejected_ids, rejected_offsets = _encode([p[2] for p in pending], tokenizer)
    out = []
    seq_len = data_cfg.seq_len
    for n, (_, chosen_spans, _, rejected_spans, where) in enumerate(pending):
        sides = []
        for ids, offsets, spans in ((chosen_ids[n], chosen_offsets[n], chosen_spans), (rejected_ids[n], rejected_offsets[n], rejected_spans)):
            ids = np.asarray(ids, dtype=np.int64)
            trained = trained_mask(offsets, spans)
            if data_cfg.prepend_bos:
                ids, trained = np.concatenate([[tokenizer.bos_token_id], ids]), np.concatenate([[False], trained])
            sides.append((ids, trained))
        longest = max(len(ids) for ids, _ in sides)
        if longest > seq_len:
            if data_cfg.too_long == TooLongPolicy.error:
                raise ConfigError(Problem("data.too_long", "error", f"{where}: a preference sequence of {longest} tokens is longer than data.seq_len={seq_len}", "raise data.seq_len, or set data.too_long=truncate or skip"))
            if data_cfg.too_long == TooLongPolicy.skip:
                counts.too_long_skipped += 1
                counts.longest_skipped = max(counts.longest_skipped, longest)
                continue
            prompt_tokens = max(int(np.argmax(trained)) if trained.any() else len(ids) for ids, trained in sides)
            if prompt_tokens >= seq_len:  # no answer token would be inside the window
                bad.report(where, "the prompt leaves no room for the answer", f"{prompt_tokens} prompt tokens, data.seq_len={seq_len}", NO_ROOM_FIX)
                continue
            sides = [(ids[:seq_len], trained[:seq_len]) for ids, trained in sides]
            counts.truncated += 1
        (c_ids, c_trained), (r_ids, r_trained) = sides
        c_labels, r_labels = shifted_labels(c_ids, c_trained), shifted_labels(r_ids, r_trained)
        if not (c_labels != IGNORE).any() or not (r_labels != IGNORE).any():
            bad.report(where, "an answer has no tokens", "the template left nothing to score")
            continue
        out.append(PreferencePair(c_ids, c_labels, r_ids, r_labels))
    return out


class PreferenceDataset(Dataset):
    """One pair per item; `ref_logps` ((n, 2): chosen, rejected) once the reference's log-probs
    are known (finetune.precompute_reference), carried into every batch."""

    def __init__(self, pairs: list[PreferencePair]):
        self.pairs = pairs
        self.lengths = [p.length for p in pairs]
        self.ref_logps: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, i: int) -> dict:
        p = self.pairs[i]
        item = {
            "chosen_input_ids": torch.from_numpy(p.chosen_ids),
            "chosen_labels": torch.from_numpy(p.chosen_labels),
            "rejected_input_ids": torch.from_numpy(p.rejected_ids),
            "rejected_labels": torch.from_numpy(p.rejected_labels),
        }
        if self.ref_logps is not None:
            item["ref_logps"] = torch.from_numpy(self.ref_logps[i])
        return item


class PreferenceCollator:
    """A micro batch of B pairs as 2B rows, chosen answers first then the rejected ones in the
    same order (TRL's layout), padded together to the longest; `ref_logps` (2B,) alike."""

    def __init__(self, pad_id: int, multiple: int = 8):
        self.padded = PaddedCollator(pad_id, multiple)

    def __call__(self, items: list[dict]) -> dict:
        rows = [{"input_ids": it[f"{side}_input_ids"], "labels": it[f"{side}_labels"]} for side in ("chosen", "rejected") for it in items]
        batch = self.padded(rows)
        if "ref_logps" in items[0]:
            ref = torch.stack([it["ref_logps"] for it in items])  # (B, 2)
            batch["ref_logps"] = torch.cat([ref[:, 0], ref[:, 1]])
        return batch

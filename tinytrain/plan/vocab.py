"""Vocab arithmetic: pure functions, the only place the padded vocab size is computed.

DESIGN.md: n = len(tokenizer) (added tokens included), padded = ceil(n / (m * tp)) * (m * tp).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class VocabPlan:
    true: int  # len(tokenizer)
    padded: int  # rows in the embedding and lm_head
    multiple: int  # model.vocab_multiple
    tp: int  # tensor-parallel size the padding is aligned to

    @property
    def padding_rows(self) -> int:
        return self.padded - self.true

    def describe(self) -> str:
        return f"vocab {self.true} -> {self.padded} (multiple {self.multiple} x tp {self.tp})"


def padded_vocab_size(true_vocab: int, multiple: int, tp: int) -> int:
    if true_vocab <= 0:
        raise ValueError(f"true_vocab must be positive, got {true_vocab}")
    if multiple <= 0 or tp <= 0:
        raise ValueError(f"vocab multiple ({multiple}) and tp ({tp}) must be positive")
    step = multiple * tp
    return math.ceil(true_vocab / step) * step


def plan_vocab(true_vocab: int, multiple: int, tp: int) -> VocabPlan:
    return VocabPlan(true_vocab, padded_vocab_size(true_vocab, multiple, tp), multiple, tp)

"""Collation of variable-length samples: right-padded to the longest in the batch, rounded up to a
multiple (8 by default, what tensor cores like), so "each element in list of batch should be of
equal size" never happens.

Unpacked samples get an attention_mask (1 = real token). Packed rows carry position_ids instead:
their padding becomes one more segment (positions 0, 1, ... after the last sample), which the
model's packed-sequence mask keeps apart from the real tokens, so no attention_mask is needed (and
passing one would switch the packed-sequence mask off).
"""

from __future__ import annotations

import torch

IGNORE = -100


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


class PaddedCollator:
    def __init__(self, pad_id: int, multiple: int = 8):
        self.pad_id = pad_id
        self.multiple = multiple

    def __call__(self, samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        width = round_up(max(len(s["input_ids"]) for s in samples), self.multiple)
        packed = "position_ids" in samples[0]
        batch = {
            "input_ids": torch.full((len(samples), width), self.pad_id, dtype=torch.long),
            "labels": torch.full((len(samples), width), IGNORE, dtype=torch.long),
        }
        if packed:
            batch["position_ids"] = torch.arange(width).repeat(len(samples), 1)
        else:
            batch["attention_mask"] = torch.zeros((len(samples), width), dtype=torch.long)
        for row, s in enumerate(samples):
            n = len(s["input_ids"])
            batch["input_ids"][row, :n] = s["input_ids"]
            batch["labels"][row, :n] = s["labels"]
            if packed:
                batch["position_ids"][row, :n] = s["position_ids"]
                batch["position_ids"][row, n:] = torch.arange(width - n)
            else:
                batch["attention_mask"][row, :n] = 1
        return batch

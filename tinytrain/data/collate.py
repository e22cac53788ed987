"""Collation of variable-length samples: right-padded to the longest in the batch, rounded up to a
multiple (8 by default, what tensor cores like), so "each element in list of batch should be of
equal size" never happens.

Unpacked samples get an attention_mask (1 = real token). Packed rows carry position_ids instead:
their padding becomes one more segment (positions 0, 1, ... after the last sample), which the
model's packed-sequence mask keeps apart from the real tokens, so no attention_mask is needed (and
passing one would switch the packed-sequence mask off).

Packed batches also carry their document boundaries for flash-attn's varlen kernel, computed here on
the CPU (in the loader workers) so the GPU never waits on a device-to-host copy to find them:
`cu_seq_lens`, where every document starts in the batch flattened to one row (and the total), and
`max_length`, the longest. Packed SFT rows carry `padding` (padding tokens per row), so throughput
can leave padding out. Every batch carries the counts its FLOPs are measured by (`COUNTS`: real
tokens and the sum of squared attention spans) as plain numbers for the same reason: counted on the
device after the step, they would make the host wait for each micro batch to finish.
"""

from __future__ import annotations

import torch
from torch.utils.data import default_collate

IGNORE = -100
# (real tokens, sum of squared attention spans) of a batch: what ThroughputMonitor counts FLOPs by.
COUNTS = "tokens_and_squares"


def document_boundaries(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(cu_seq_lens, max_length) of the (rows, seq) batch flattened to one row: a document starts
    where its position ids restart at 0, and so does every row."""
    starts = position_ids == 0
    starts[:, 0] = True
    flat = starts.reshape(-1).nonzero().view(-1)
    cu = torch.cat([flat, torch.tensor([position_ids.numel()])]).to(torch.int32)
    return cu, int(cu.diff().max())


def with_document_boundaries(batch: dict) -> dict:
    """The batch with its documents' boundaries (packed rows) and its throughput counts."""
    if "position_ids" in batch:
        batch["cu_seq_lens"], batch["max_length"] = document_boundaries(batch["position_ids"])
    batch[COUNTS] = tokens_and_squares(batch)
    return batch


def batch_boundaries(batch: dict) -> tuple[torch.Tensor, int]:
    """The packed batch's (cu_seq_lens, max_length): the collator's, or found in its position ids
    (a batch from another loader, or one given rows since; on a device batch, a wait for it)."""
    if "cu_seq_lens" in batch and "max_length" in batch:
        return batch["cu_seq_lens"], int(batch["max_length"])
    return document_boundaries(batch["position_ids"].cpu())


def tokens_and_squares(batch: dict) -> tuple[int, int]:
    """Real tokens in a batch and sum(attention span^2): packed documents by their position ids,
    padded SFT rows by their attention mask (padding is compute, not model FLOPs). The padding of a
    packed SFT row is one more segment of position ids (PaddedCollator), of `padding` tokens. On a
    device batch each read waits for the device; the collators count on the CPU."""
    rows, seq = batch["input_ids"].shape
    if "position_ids" in batch:
        spans = batch_boundaries(batch)[0].diff().long()
        tokens, squares = rows * seq, int((spans * spans).sum())
        if "padding" in batch:
            pad = batch["padding"]
            tokens, squares = tokens - int(pad.sum()), squares - int((pad * pad).sum())
        return tokens, squares
    mask = batch.get("attention_mask")
    if mask is not None:
        lengths = mask.sum(dim=1)
        return int(lengths.sum()), int((lengths * lengths).sum())
    return rows * seq, rows * seq * seq


def collate_windows(samples: list[dict[str, torch.Tensor]]) -> dict:
    """Fixed-size pretraining windows: stacked, plus their document boundaries when isolated."""
    return with_document_boundaries(default_collate(samples))


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
            batch["padding"] = torch.zeros(len(samples), dtype=torch.long)
        else:
            batch["attention_mask"] = torch.zeros((len(samples), width), dtype=torch.long)
        for row, s in enumerate(samples):
            n = len(s["input_ids"])
            batch["input_ids"][row, :n] = s["input_ids"]
            batch["labels"][row, :n] = s["labels"]
            if packed:
                batch["position_ids"][row, :n] = s["position_ids"]
                batch["position_ids"][row, n:] = torch.arange(width - n)
                batch["padding"][row] = width - n
            else:
                batch["attention_mask"][row, :n] = 1
        return with_document_boundaries(batch)

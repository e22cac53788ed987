"""Packed batches on a varlen kernel (torch's, or flash-attn's): one flattened row with the documents' boundaries.

transformers 5 takes flash-attn's varlen path from position ids only for a batch of one row
(`_is_packed_sequence` is False when batch_size != 1): a packed batch of several rows would get
plain causal attention across its documents. So, as `DataCollatorWithFlattening` does, the rows
go in as one row of rows x seq tokens with `cu_seq_lens_q/k` and `max_length_q/k`, which puts the
dispatch on the varlen kernel directly (and skips its per-layer device sync of detecting packing).
torch's varlen kernel (model/varlen_attention.py) reads the same keys. SDPA and eager need none of
this: they build a block-diagonal mask from the position ids.
"""

from __future__ import annotations

import torch

from tinytrain.data.collate import document_boundaries
from tinytrain.plan.attention import TORCH_VARLEN


def takes_boundaries(model) -> bool:
    """A varlen kernel: torch's (model/varlen_attention.py, and its CPU reference) or flash-attn's
    (transformers' own test, `is_flash_attention_requested`: any implementation named *flash*)."""
    implementation = model.config._attn_implementation or ""
    return "flash" in implementation or implementation.startswith(TORCH_VARLEN)


def flatten_for_flash(input_ids: torch.Tensor, position_ids: torch.Tensor, cu_seq_lens: torch.Tensor | None = None, max_length: int | None = None) -> dict:
    """Model inputs for a (rows, seq) packed batch as one row; boundaries from the collator, or
    found here from the position ids (a batch from another loader)."""
    if cu_seq_lens is None or max_length is None:
        cu_seq_lens, max_length = document_boundaries(position_ids.cpu())
    cu_seq_lens = cu_seq_lens.to(device=input_ids.device, dtype=torch.int32)
    return {
        "input_ids": input_ids.reshape(1, -1),
        "position_ids": position_ids.reshape(1, -1),
        "cu_seq_lens_q": cu_seq_lens,
        "cu_seq_lens_k": cu_seq_lens,
        "max_length_q": int(max_length),
        "max_length_k": int(max_length),
    }

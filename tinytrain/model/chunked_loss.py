"""Cross-entropy from hidden states in chunks of tokens, for large vocabularies.

The logits of one chunk (chunk x vocab) exist at a time, in forward and again in backward
(each chunk is recomputed under activation checkpointing), so a 128k-vocab model never holds
the full fp32 logits. Same value and gradients as causal_lm_loss over full logits.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _chunk_loss_sum(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, true_vocab: int) -> torch.Tensor:
    logits = F.linear(hidden, weight[:true_vocab])  # padded rows never computed
    return F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")


def chunked_lm_loss(hidden: torch.Tensor, lm_head_weight: torch.Tensor, labels: torch.Tensor, *, true_vocab: int, chunk_tokens: int) -> torch.Tensor:
    """Mean cross-entropy over labelled tokens (labels pre-shifted, -100 ignored)."""
    hidden = hidden.reshape(-1, hidden.shape[-1])
    labels = labels.reshape(-1)
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, labels.numel(), chunk_tokens):
        h, y = hidden[start : start + chunk_tokens], labels[start : start + chunk_tokens]
        total = total + checkpoint(_chunk_loss_sum, h, lm_head_weight, y, true_vocab, use_reentrant=False)
    count = (labels != -100).sum().clamp(min=1)
    return total / count

"""Cross-entropy from hidden states in chunks of tokens, for large vocabularies.

The logits of one chunk (chunk x vocab) exist at a time, in forward and again in backward
(each chunk is recomputed under activation checkpointing), so a 128k-vocab model never holds
the full fp32 logits. Same value and gradients as causal_lm_loss over full logits.

The head is the lm_head's weight, or under tensor parallelism the lm_head module itself: its
weight is then split by vocab rows over the tp ranks, and the module's own parallel style
(model/tensor_parallel.py) gathers each chunk's logits whole, as it does the plain loss's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def chunk_logits(hidden: torch.Tensor, head: torch.Tensor | torch.nn.Module, true_vocab: int) -> torch.Tensor:
    if isinstance(head, torch.Tensor):
        return F.linear(hidden, head[:true_vocab])  # padded rows never computed
    return head(hidden)[..., :true_vocab]  # gathered over the tp ranks, then the padding dropped


def _chunk_loss_sum(hidden: torch.Tensor, head: torch.Tensor | torch.nn.Module, labels: torch.Tensor, true_vocab: int) -> torch.Tensor:
    logits = chunk_logits(hidden, head, true_vocab)
    return F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")


def chunked_lm_loss(hidden: torch.Tensor, head: torch.Tensor | torch.nn.Module, labels: torch.Tensor, *, true_vocab: int, chunk_tokens: int) -> torch.Tensor:
    """Mean cross-entropy over labelled tokens (labels pre-shifted, -100 ignored)."""
    hidden = hidden.reshape(-1, hidden.shape[-1])
    labels = labels.reshape(-1)
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, labels.numel(), chunk_tokens):
        h, y = hidden[start : start + chunk_tokens], labels[start : start + chunk_tokens]
        total = total + checkpoint(_chunk_loss_sum, h, head, y, true_vocab, use_reentrant=False)
    count = (labels != -100).sum().clamp(min=1)
    return total / count

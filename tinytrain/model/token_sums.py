"""A micro batch's loss as a sum over its labelled tokens, for means taken over more than it (a cp
group's sequence, an optimizer step's micro batches: train/callbacks/step_tokens.py)."""

from __future__ import annotations

import torch


def token_sum(mean: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """A mean over labelled tokens (-100 ignored) back to their sum: 0 for a batch with none (whose
    mean is NaN), chosen on the device (a Python `if` on the count would wait for it)."""
    count = (labels != -100).sum()
    return torch.where(count > 0, mean.float() * count, torch.zeros((), device=mean.device))

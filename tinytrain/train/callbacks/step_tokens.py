"""A fine-tuning step's loss is the mean over all of its trained tokens, whatever the split.

Each micro batch's loss was its own mean over its labelled tokens; accumulation and the data-parallel
average then took the mean of those means, so a 10-token answer weighed 4.7x a 47-token one per token
and the gradient changed with the micro batch, the accumulation and the number of GPUs. The step's
samples (every rank's) are known from the sampler (data/sampler.py current_step), their trained
tokens from the dataset: each micro batch's loss is its sum over tokens divided by the step's tokens
per micro batch, so the accumulation's and the ranks' averages give the step's token mean. No
collective, nothing read from the device. A fine-tuning mixture's step is known the same way (its
stream is a function of the sample number). Pretraining windows (every token trained but document
boundaries) keep each micro batch's mean.
"""

from __future__ import annotations

import lightning.pytorch as pl
import numpy as np


class StepTokens(pl.Callback):
    def __init__(self, sampler, labelled):
        self.sampler = sampler  # ResumableBatchSampler (or the batch ramp's), or a mixture's MixtureBatchSampler
        self.labelled = labelled  # trained tokens per dataset item (numpy)
        self.step_key: tuple | None = None
        self.shares = (1.0, 1.0)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        key = self.sampler.step_key()
        if key != self.step_key:  # the step's samples are read once, at its first micro batch
            self.step_key = key
            tokens = [int(self.labelled[b].sum()) for b in self.sampler.current_step()]
            # This rank's micro batches are every world-th of the step's (dealt round-robin).
            mine = tokens[self.sampler.rank :: self.sampler.world]
            self.shares = (max(sum(tokens), 1) / len(tokens), max(sum(mine), 1) / len(mine))
        # The backward divides by the step's share; the logged loss is rescaled to this rank's
        # token mean (its micro batches' sums over its own tokens), a loss at any data parallelism.
        pl_module.loss_share, pl_module.own_loss_share = self.shares


def step_tokens_callback(train_sampler, train_dataset, objective) -> list:
    """StepTokens where the loss is a token mean of fine-tuning rows drawn by a ResumableBatchSampler
    (or the batch ramp's) or a mixture's MixtureBatchSampler (indices into its sources' ConcatDataset)."""
    from torch.utils.data import ConcatDataset

    from tinytrain.data.mixture_sampler import MixtureBatchSampler
    from tinytrain.data.sampler import ResumableBatchSampler

    parts = train_dataset.datasets if isinstance(train_dataset, ConcatDataset) else [train_dataset]
    if objective is not None or not isinstance(train_sampler, ResumableBatchSampler | MixtureBatchSampler) or not all(hasattr(d, "labelled") for d in parts):
        return []
    return [StepTokens(train_sampler, np.concatenate([d.labelled for d in parts]))]

"""finetune.precompute_reference on a cache miss: at fit start, before the first step, the model as
it starts (the reference: the initial weights; under LoRA with its adapters disabled) scores every
train and validation pair once; the log-probs go into the datasets, so each batch carries them,
and rank 0 writes the cache (tinytrain/data/reference_cache.py).

Every rank scores every pair, in the same order: the forwards are collectives under ZeRO-3 and
FSDP2 x TP (every rank must run each one, tensor-parallel ranks on the same input), and no rank
needs another's results afterwards. It is one forward pass over the data per rank. Whether to
score is decided by all ranks together: one that found no cache (another node's data.cache_dir)
makes every rank score, so none waits in a collective the others never enter.
"""

from __future__ import annotations

import logging
import time

import lightning.pytorch as pl
import numpy as np
import torch

from tinytrain.model.reference import adapters_disabled

log = logging.getLogger(__name__)


class PrecomputeReference(pl.Callback):
    def __init__(self, cache, *, train, val, collate, micro_batch_size: int, loaded: bool):
        self.cache, self.train, self.val = cache, train, val
        self.collate = collate
        self.micro_batch_size = micro_batch_size
        self.loaded = loaded  # this rank found the cache

    def on_fit_start(self, trainer, pl_module) -> None:
        if trainer.strategy.reduce_boolean_decision(self.loaded, all=True):
            return
        start = time.perf_counter()
        was_training = pl_module.model.training
        pl_module.model.eval()
        try:
            for ds in (self.train, self.val):
                ds.ref_logps = self.score(trainer, pl_module, ds)
        finally:
            pl_module.model.train(was_training)
        if trainer.is_global_zero:
            self.cache.save(self.train, self.val)
        trainer.strategy.barrier("tinytrain.reference_logps")
        if trainer.is_global_zero:
            print(f"reference log-probs of {len(self.train):,} train + {len(self.val):,} validation pairs computed in {time.perf_counter() - start:.1f} s, cached at {self.cache.path}", flush=True)

    @torch.no_grad()
    def score(self, trainer, pl_module, ds) -> np.ndarray:
        import contextlib

        out = np.zeros((len(ds), 2), dtype=np.float64)
        reference = adapters_disabled(pl_module.model) if pl_module.adapters else contextlib.nullcontext()
        with reference, trainer.precision_plugin.forward_context():
            for start in range(0, len(ds), self.micro_batch_size):
                items = [ds[i] for i in range(start, min(start + self.micro_batch_size, len(ds)))]
                batch = {k: v.to(pl_module.device) if isinstance(v, torch.Tensor) else v for k, v in self.collate(items).items()}
                chosen, rejected = pl_module.sequence_logps(batch)[0].double().cpu().chunk(2)
                out[start : start + len(items), 0] = chosen.numpy()
                out[start : start + len(items), 1] = rejected.numpy()
        return out

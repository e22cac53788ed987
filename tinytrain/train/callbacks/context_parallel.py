"""parallel.cp > 1: DeepSpeed's Ulysses attention wrapped around the model (model/context_parallel.py).

At `setup`, after the strategy has started deepspeed.comm and before it calls deepspeed.initialize
(which is when Lightning runs setup hooks), so the engine is built around the wrapped attention.
"""

from __future__ import annotations

import logging

import lightning.pytorch as pl

from tinytrain.model.context_parallel import enable_ulysses

log = logging.getLogger(__name__)


class ContextParallel(pl.Callback):
    def __init__(self, cp: int, micro_batch_size: int):
        self.cp = cp
        self.micro_batch_size = micro_batch_size

    def setup(self, trainer, pl_module, stage):
        if pl_module.context is not None:
            return
        pl_module.context = enable_ulysses(pl_module.model, cp=self.cp, micro_batch_size=self.micro_batch_size)
        log.info("context parallel: rank %d of a cp group of %d (DeepSpeed Ulysses, attention %s)", pl_module.context.rank, self.cp, pl_module.model.config._attn_implementation)

"""parallel.cp > 1: the plan's kind of sequence split wrapped around the model.

Ulysses (model/context_parallel.py): DeepSpeed's attention, at `setup`, after the strategy has
started deepspeed.comm and before it calls deepspeed.initialize (which is when Lightning runs setup
hooks), so the engine is built around the wrapped attention.
Ring (model/ring_attention.py): torch's context parallel on the cp dimension of a dp x cp x tp mesh,
at `setup` too: the process group is up, and FSDP2 and tensor parallelism come after
(`configure_model`), laid out the same way.
"""

from __future__ import annotations

import logging

import lightning.pytorch as pl

log = logging.getLogger(__name__)


class ContextParallel(pl.Callback):
    def __init__(self, cp: int, micro_batch_size: int, kind: str = "ulysses", tp: int = 1):
        self.cp = cp
        self.micro_batch_size = micro_batch_size
        self.kind = kind
        self.tp = tp

    def setup(self, trainer, pl_module, stage):
        if pl_module.context is not None:
            return
        if self.kind == "ring":
            from tinytrain.model.ring_attention import enable_ring_on

            device_type = trainer.strategy.root_device.type
            pl_module.context = enable_ring_on(pl_module.model, device_type, trainer.world_size, cp=self.cp, tp=self.tp)
            kernel = "compiled flex attention" if device_type == "cuda" else "SDPA over the block mask: flex attention has no CPU backward"
            log.info("context parallel: rank %d of a cp group of %d (torch's ring, %s)", pl_module.context.rank, self.cp, kernel)
            return
        from tinytrain.model.context_parallel import enable_ulysses

        pl_module.context = enable_ulysses(pl_module.model, cp=self.cp, micro_batch_size=self.micro_batch_size)
        log.info("context parallel: rank %d of a cp group of %d (DeepSpeed Ulysses, attention %s)", pl_module.context.rank, self.cp, pl_module.model.config._attn_implementation)

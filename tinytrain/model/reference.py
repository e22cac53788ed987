"""The reference model of DPO and IPO, without a second copy where one can be avoided.

finetune=lora|qlora   the policy with its adapters disabled (peft's enable_adapters(False) on every
                      adapter layer: what PeftModel.disable_adapter does), so the reference is the
                      frozen base itself
finetune=full         a frozen copy of the initial weights, held the way the strategy holds the
                      policy: on the device (single, ddp), sharded by FSDP2 x TP like the policy
                      (fsdp_tp), or in a DeepSpeed engine of its own without optimizer (ZeRO-3:
                      partitioned; ZeRO-1/2: whole, in the 16-bit dtype), as TRL prepares its
                      reference under DeepSpeed
precompute_reference  neither: the log-probs were computed before training and ride in the batch

The copy is deliberately not a registered submodule of the LightningModule: checkpoints, the
optimizer, gradient clipping and the export never see it.
"""

from __future__ import annotations

import contextlib
import logging

import torch

log = logging.getLogger(__name__)


@contextlib.contextmanager
def adapters_disabled(model: torch.nn.Module):
    """peft's adapter layers of `model` switched off for the block (the base alone computes)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


class FrozenReference:
    """A frozen copy of the initial model; `place` puts it where the strategy put the policy."""

    def __init__(self, model: torch.nn.Module):
        model.requires_grad_(False)
        model.eval()
        self._held = [model]  # a list, so that no nn.Module registers it as a submodule
        self.engine = None  # the DeepSpeed engine holding it, under DeepSpeed

    @property
    def model(self) -> torch.nn.Module:
        return self._held[0]

    def shard(self, parallelize, device_mesh, device) -> None:
        """fsdp_tp: the same FSDP2 x TP layout as the policy (called from configure_model)."""
        self.model.to(device)
        parallelize(self.model, device_mesh)
        log.info("reference: a frozen copy sharded like the policy (FSDP2 x TP over %s)", dict(zip(device_mesh.mesh_dim_names, device_mesh.shape)))

    def place(self, trainer, deepspeed_config: dict | None) -> None:
        """At fit start, after the strategy has set the policy up."""
        if deepspeed_config is not None:
            self.engine = deepspeed_reference_engine(self.model, deepspeed_config, trainer.strategy.local_rank)
            log.info("reference: a frozen copy in a DeepSpeed engine of its own, ZeRO stage %d (no optimizer)", self.engine.zero_optimization_stage())
        else:
            self.model.to(trainer.strategy.root_device)
            log.info("reference: a frozen copy on %s", trainer.strategy.root_device)

    def __call__(self, **kwargs):
        return (self.engine or self.model)(**kwargs)


def deepspeed_reference_engine(model: torch.nn.Module, config: dict, local_rank: int):
    """An inference engine for the reference: the run's DeepSpeed config without its optimizer,
    stage 3 kept (parameters partitioned like the policy's), stages 1-2 as stage 0 (a whole
    16-bit copy: those stages partition only optimizer state and gradients, which it has none of)."""
    import argparse
    import copy

    import deepspeed

    cfg = copy.deepcopy(config)
    zero = cfg.setdefault("zero_optimization", {})
    zero.pop("offload_optimizer", None)
    if zero.get("stage", 0) != 3:
        cfg["zero_optimization"] = {"stage": 0}
    for key in ("optimizer", "scheduler", "gradient_clipping"):
        cfg.pop(key, None)
    engine, *_ = deepspeed.initialize(args=argparse.Namespace(device_rank=local_rank), model=model, config=cfg, dist_init_required=False)
    engine.eval()
    return engine

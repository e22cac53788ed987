"""Lightning accelerator, strategy and precision plugin for the resolved run."""

from __future__ import annotations

from dataclasses import dataclass

from tinytrain.config.schema import Strategy
from tinytrain.precision import PrecisionDecision


@dataclass
class TrainerHardware:
    accelerator: str  # "cpu" | "gpu"
    devices: int
    num_nodes: int
    strategy: object  # a Lightning strategy or its name
    precision: object  # Lightning precision string or plugin


def precision_plugin(decision: PrecisionDecision, accelerator: str):
    """Lightning's own string, except fp16: an explicit MixedPrecision plugin carries the
    loss-scale policy into GradScaler (and on CPU stops Lightning silently swapping in bf16)."""
    if decision.value != "16-mixed":
        return decision.value
    import torch
    from lightning.pytorch.plugins.precision import MixedPrecision

    device = "cuda" if accelerator == "gpu" else "cpu"
    scaler = torch.amp.GradScaler(device, **decision.loss_scale.to_grad_scaler_kwargs())
    return MixedPrecision("16-mixed", device, scaler=scaler)


def build_trainer_hardware(cfg, decision: PrecisionDecision, on_gpu: bool, devices: int) -> TrainerHardware:
    accelerator = "gpu" if on_gpu else "cpu"
    if cfg.parallel.strategy == Strategy.ddp:
        from lightning.pytorch.strategies import DDPStrategy

        strategy = DDPStrategy(process_group_backend="nccl" if on_gpu else "gloo")
    else:
        strategy = "auto"
    return TrainerHardware(accelerator, devices, cfg.cluster.nodes, strategy, precision_plugin(decision, accelerator))

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


def precision_plugin(decision: PrecisionDecision, accelerator: str, strategy: Strategy):
    """Lightning's own string, except fp16 outside DeepSpeed: an explicit MixedPrecision plugin
    carries the loss-scale policy into GradScaler (and on CPU stops Lightning silently swapping
    in bf16). Under DeepSpeed the policy travels in the generated config's fp16 block."""
    if decision.value != "16-mixed" or strategy == Strategy.deepspeed:
        return decision.value
    import torch
    from lightning.pytorch.plugins.precision import MixedPrecision

    device = "cuda" if accelerator == "gpu" else "cpu"
    scaler = torch.amp.GradScaler(device, **decision.loss_scale.to_grad_scaler_kwargs())
    return MixedPrecision("16-mixed", device, scaler=scaler)


def build_strategy(cfg, on_gpu: bool, data_parallel: int, deepspeed_config: dict | None):
    backend = "nccl" if on_gpu else "gloo"
    kind = cfg.parallel.strategy
    if kind == Strategy.ddp:
        from lightning.pytorch.strategies import DDPStrategy

        return DDPStrategy(process_group_backend=backend)
    if kind == Strategy.deepspeed:
        from lightning.pytorch.strategies import DeepSpeedStrategy

        return DeepSpeedStrategy(config=deepspeed_config, process_group_backend=backend)
    if kind == Strategy.fsdp_tp:
        from lightning.pytorch.strategies import ModelParallelStrategy

        # One full checkpoint file on rank 0: tinytrain unpads it after the gather and any tp
        # can load it (tinytrain/checkpoint.py).
        return ModelParallelStrategy(
            data_parallel_size=data_parallel,
            tensor_parallel_size=cfg.parallel.tp,
            save_distributed_checkpoint=False,
            process_group_backend=backend,
        )
    return "auto"


def build_trainer_hardware(cfg, decision: PrecisionDecision, on_gpu: bool, devices: int, data_parallel: int, deepspeed_config: dict | None) -> TrainerHardware:
    accelerator = "gpu" if on_gpu else "cpu"
    return TrainerHardware(
        accelerator,
        devices,
        cfg.cluster.nodes,
        build_strategy(cfg, on_gpu, data_parallel, deepspeed_config),
        precision_plugin(decision, accelerator, cfg.parallel.strategy),
    )

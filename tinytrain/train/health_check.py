"""`mode=health` and `cluster.health_check`: cluster/health.py's check on this run's world, through
Lightning Fabric's launcher (mode=health: the same ranks, rendezvous and Slurm environment
training uses, without a model) or inside the Trainer before the model is set up."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning.pytorch as pl

from tinytrain.cluster import health, slurm

log = logging.getLogger(__name__)


def check_dtype_and_peak(device, hardware):
    """bf16 where the GPU has it, else fp16 on a GPU, fp32 on a CPU; and the table's dense peak for it."""
    import torch

    if device.type != "cuda":
        return torch.float32, None
    if torch.cuda.get_device_capability(device)[0] >= 8:
        return torch.bfloat16, hardware.peak_bf16_tflops
    return torch.float16, hardware.peak_fp16_tflops


def run_health(cfg, run_dir: Path) -> dict:
    """mode=health: the check alone on every rank of the configured world, then stop."""
    import torch
    from lightning.fabric import Fabric

    from tinytrain.plan import resolve
    from tinytrain.plan.layout import devices_per_node, world_size
    from tinytrain.train.trainer import cluster_plugins

    world = world_size(cfg)
    fabric = Fabric(accelerator="cuda" if torch.cuda.is_available() else "cpu", devices=devices_per_node(cfg), num_nodes=cfg.cluster.nodes, strategy="ddp" if world > 1 else "auto", plugins=cluster_plugins())
    fabric.launch()
    dtype, peak = check_dtype_and_peak(fabric.device, resolve.effective_hardware(cfg))
    verdict = health.check_world(fabric.device, dtype, cfg.cluster.health_budget_s, peak)
    if fabric.global_rank == 0:
        print(health.render(verdict), flush=True)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "health.json").write_text(json.dumps({k: v for k, v in verdict.items()}, indent=2, default=str) + "\n")
    outcome = health.act(verdict, cfg.cluster.on_bad_node.value, slurm.job_id(), requeues=fabric.global_rank == 0)  # raises for stop and exclude
    if fabric.global_rank == 0 and verdict["bad"]:
        print(outcome, flush=True)
    return verdict


class HealthCheck(pl.Callback):
    """cluster.health_check before training: once the process group exists, before the model is
    moved to the device and its optimizer built."""

    def __init__(self, budget_s: int, on_bad_node: str, hardware):
        self.budget_s, self.on_bad_node, self.hardware = budget_s, on_bad_node, hardware

    def setup(self, trainer, pl_module, stage):
        device = trainer.strategy.root_device
        dtype, peak = check_dtype_and_peak(device, self.hardware)
        verdict = health.check_world(device, dtype, self.budget_s, peak)
        if trainer.is_global_zero:
            log.info("%s", health.render(verdict))
        outcome = health.act(verdict, self.on_bad_node, slurm.job_id(), requeues=trainer.is_global_zero)
        if verdict["bad"] and trainer.is_global_zero:
            log.warning("%s", outcome)

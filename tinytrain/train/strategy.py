"""Lightning accelerator, strategy and precision plugin for the resolved run."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.strategies import DeepSpeedStrategy
from lightning.pytorch.strategies.ddp import DDPStrategy

from tinytrain.checkpoint.files import publish_directory, temp_path
from tinytrain.checkpoint.universal import convert, group_settings, repair_stage3_load, universal_path
from tinytrain.cluster.deepspeed_comm import skip_shared_memory_all_reduce
from tinytrain.config.schema import Strategy
from tinytrain.errors import TrainingStopped
from tinytrain.plan.deepspeed_config import for_lightning
from tinytrain.plan.precision import PrecisionDecision
from tinytrain.plan.run_plan import ParallelLayout, RunPlan
from tinytrain.train.sharded_checkpoints import ShardedModelParallelStrategy

if TYPE_CHECKING:
    from lightning.pytorch.plugins.precision import MixedPrecision
    from lightning.pytorch.strategies import Strategy as LightningStrategy


@dataclass(frozen=True)
class TrainerHardware:
    accelerator: str  # "cpu" | "gpu"
    devices: int
    num_nodes: int
    strategy: LightningStrategy | str  # "auto" for one process
    precision: str  # Lightning's name for the plan's precision
    precision_plugin: MixedPrecision | None  # replaces `precision` where set (fp16 outside DeepSpeed)


def precision_plugin(decision: PrecisionDecision, accelerator: str, loss_scale_in_engine: bool) -> MixedPrecision | None:
    """fp16 outside DeepSpeed: an explicit MixedPrecision plugin carries the loss-scale policy
    into GradScaler (and on CPU stops Lightning silently swapping in bf16). Elsewhere None:
    Lightning's own name does, and under DeepSpeed the policy travels in the generated config's
    fp16 block."""
    if not decision.is_fp16 or loss_scale_in_engine:
        return None
    import torch
    from lightning.pytorch.plugins.precision import MixedPrecision

    device = "cuda" if accelerator == "gpu" else "cpu"
    scaler = torch.amp.GradScaler(device, **decision.loss_scale.to_grad_scaler_kwargs())
    return MixedPrecision("16-mixed", device, scaler=scaler)


def ddp_strategy(parallel: ParallelLayout, *, backend: str, deepspeed_config: dict | None, async_save: bool, timeout=None):
    # Gradients as views into the all-reduce buckets: without it DDP keeps a second copy of every
    # gradient (4 B per parameter on each rank), which the plan's memory line does not count.
    return DDPStrategy(process_group_backend=backend, gradient_as_bucket_view=True, **pg_timeout(timeout))


def deepspeed_strategy(parallel: ParallelLayout, *, backend: str, deepspeed_config: dict | None, async_save: bool, timeout=None):
    cls = CPUDeepSpeedStrategy if parallel.deepspeed_on_cpu else AtomicDeepSpeedStrategy
    return cls(config=for_lightning(deepspeed_config), process_group_backend=backend, **pg_timeout(timeout))


def model_parallel_strategy(parallel: ParallelLayout, *, backend: str, deepspeed_config: dict | None, async_save: bool, timeout=None):
    # Every rank saves its own shards (train/sharded_checkpoints.py): no rank gathers the state.
    return ShardedModelParallelStrategy(
        async_save=async_save,
        data_parallel_size=parallel.dp * parallel.cp,  # FSDP shards over the cp ranks too (Ulysses: tp 1)
        tensor_parallel_size=parallel.tp,
        process_group_backend=backend,
        **pg_timeout(timeout),
    )


def one_process(parallel: ParallelLayout, *, backend: str, deepspeed_config: dict | None, async_save: bool, timeout=None):
    return "auto"


# Each strategy's Lightning strategy (the rest of what a strategy is: plan/parallel.py's table).
BUILDERS = {
    Strategy.single: one_process,
    Strategy.ddp: ddp_strategy,
    Strategy.deepspeed: deepspeed_strategy,
    Strategy.fsdp_tp: model_parallel_strategy,
}


def build_strategy(parallel: ParallelLayout, on_gpu: bool, deepspeed_config: dict | None, async_save: bool = False, timeout_s: int | None = None):
    """`timeout_s`: the collective timeout (plan/watchdog.py), None for the backend's default (30 min)."""
    from datetime import timedelta

    timeout = timedelta(seconds=timeout_s) if timeout_s else None
    return BUILDERS[parallel.strategy](parallel, backend="nccl" if on_gpu else "gloo", deepspeed_config=deepspeed_config, async_save=async_save, timeout=timeout)


def pg_timeout(timeout) -> dict:
    return {"timeout": timeout} if timeout is not None else {}


class AtomicDeepSpeedStrategy(DeepSpeedStrategy):
    """Lightning's DeepSpeedStrategy whose checkpoint folder appears only when every rank has
    written its shards: saved under a temp name, renamed by rank 0 after a barrier; and whose
    backward divides a micro batch's loss by the accumulation once."""

    def backward(self, closure_loss, optimizer, *args, **kwargs):
        # Lightning's loop has divided the loss by accumulate_grad_batches already, and DeepSpeed's
        # engine.backward divides it by gradient_accumulation_steps again by default: the gradients
        # (the norm DeepSpeed clips and reports) came out 1/accumulation of every other strategy's.
        return super().backward(closure_loss, optimizer, *args, scale_wrt_gas=False, **kwargs)

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        final = Path(self.broadcast(str(filepath)))  # rank 0's name (and pid) for every rank
        tmp = Path(self.broadcast(str(temp_path(final))))
        super().save_checkpoint(checkpoint, tmp, storage_options)
        self.barrier("tinytrain.atomic_deepspeed_save")
        if self.is_global_zero:
            publish_directory(tmp, final)
        self.barrier("tinytrain.atomic_deepspeed_published")

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        # The plan saw another data-parallel size and set DeepSpeed's load_universal
        # (plan/deepspeed_config.py): rank 0 converts, the others wait, all load the copy.
        if self.config.get("checkpoint", {}).get("load_universal"):
            failed = None
            if self.is_global_zero:
                try:
                    convert(Path(checkpoint_path))
                except Exception as e:  # noqa: BLE001 - every rank must hear of it, not wait forever
                    failed = f"{type(e).__name__}: {e}"
            failed = self.broadcast(failed)  # also the barrier: the others wait for rank 0
            if failed:
                raise TrainingStopped(
                    f"converting {checkpoint_path} to DeepSpeed's universal checkpoint (for another number of DeepSpeed partitions: data parallel x cp) failed: {failed}. "
                    f"The checkpoint itself is untouched: resume on the number of ranks it was saved on, or start a new run from its weights with checkpoint.init_from"
                )
            checkpoint_path = universal_path(Path(checkpoint_path))
            if self.zero_stage_3:
                optimizer = self.deepspeed_engine.optimizer.optimizer  # the base optimizer under ZeRO-3's
                before = group_settings(optimizer)
                loaded = super().load_checkpoint(checkpoint_path, weights_only)
                repair_stage3_load(optimizer, before)
                return loaded
        return super().load_checkpoint(checkpoint_path, weights_only)


class CPUDeepSpeedStrategy(AtomicDeepSpeedStrategy):
    """parallel.deepspeed_on_cpu (for tests): the same strategy without Lightning 2.6's refusals of
    CPU (the three places it assumes CUDA), so CI runs the code a GPU run uses on DeepSpeed's CPU
    accelerator over gloo. Not for real training: it is slow, and says nothing about NCCL or GPU memory."""

    def setup_environment(self):
        # DeepSpeedStrategy.setup_environment refuses any accelerator but CUDAAccelerator.
        if self.precision_plugin.precision == "16-mixed":
            allow_fp16_on_cpu()
        DDPStrategy.setup_environment(self)

    def setup_distributed(self):
        # DeepSpeedStrategy's version first checks device index == local rank; CPU devices have none.
        reset_seed()
        self.set_world_ranks()
        skip_shared_memory_all_reduce()
        self._init_deepspeed_distributed()

    def _setup_model_and_optimizer(self, model, optimizer, lr_scheduler=None):
        # Lightning passes device_rank=root_device.index (None on CPU), which DeepSpeed compares with >= 0.
        import deepspeed

        engine, ds_optimizer, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.local_rank),
            config=self.config,
            model=model,
            model_parameters=[p for p in model.parameters() if p.requires_grad],
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dist_init_required=False,
        )
        return engine, ds_optimizer


def allow_fp16_on_cpu() -> None:
    """DeepSpeed's CPU accelerator reports fp16 only on CPUs with AVX512-FP16; torch's CPU
    kernels run fp16 either way (slowly), which is all a test of the fp16 path needs."""
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator

    CPU_Accelerator.is_fp16_supported = lambda self: True


def build_trainer_hardware(plan: RunPlan) -> TrainerHardware:
    accelerator = "gpu" if plan.on_gpu else "cpu"
    return TrainerHardware(
        accelerator,
        plan.cluster.devices_per_node,
        plan.cluster.nodes,
        build_strategy(plan.parallel, plan.on_gpu, plan.deepspeed, plan.checkpoint.async_save, plan.watchdog and plan.watchdog.enabled and plan.watchdog.process_group_timeout_s),
        plan.precision.lightning,
        precision_plugin(plan.precision, accelerator, loss_scale_in_engine=plan.parallel.row.deepspeed),
    )

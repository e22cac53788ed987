"""Build and fit: tokenizer, model, data, strategy, callbacks, logger -> Lightning Trainer.

Everything here runs after the plan, so configuration problems have already been reported.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from tinytrain.fast_paths import FastPaths
from tinytrain.model_shape import ModelShape
from tinytrain.resolve import Resolved, devices_per_node

log = logging.getLogger(__name__)


def quiet_lightning() -> None:
    """Keep Lightning's own console lines once (not again through Hydra's root handler) and drop
    notices that are not about this run."""
    import warnings

    lightning_log = logging.getLogger("lightning.pytorch")
    lightning_log.propagate = False
    for handler in lightning_log.handlers:  # handler filters also see records of child loggers
        handler.addFilter(lambda record: "Tip:" not in record.getMessage())
    # The CSV logger shares the run directory with plan.json and the resolved config on purpose.
    warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    # fsdp_tp: the loss slices the gathered logits out of place, which is what FSDP2 asks for.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    # Lightning only knows resumable loaders by their state_dict; tinytrain's sampler position is
    # restored by the DataPosition callback instead, so a mid-epoch resume is exact.
    warnings.filterwarnings("ignore", message=r"You're resuming from a checkpoint that ended before the epoch ended")
    # DeepSpeed: tinytrain clips through DeepSpeed's config and measures there (module.py), and
    # DeepSpeed 0.19 still calls torch.distributed's deprecated collectives.
    warnings.filterwarnings("ignore", message=r"Since DeepSpeed handles gradient clipping internally")
    warnings.filterwarnings("ignore", message=r"`torch.distributed.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated")
    logging.getLogger("compilers").setLevel(logging.WARNING)  # DeepSpeed's op builder probing for libaio with gcc


def build_module(cfg, resolved: Resolved, tokenizer, model_config, attention, fast: FastPaths, untrained: tuple = ([], ""), resuming: bool = False):
    """`resuming`: the weights come from the resume checkpoint, so neither checkpoint.init_from nor
    the untrained-row fix is applied (Lightning loads the checkpoint over them)."""
    from tinytrain import checkpoint
    from tinytrain.config.schema import Strategy
    from tinytrain.model import build_model
    from tinytrain.module import CausalLMModule
    from tinytrain.tensor_parallel import parallelize

    model = build_model(cfg.model, model_config, attention)
    if cfg.checkpoint.init_from and not resuming:
        names = checkpoint.vocab_param_names(model)
        state = checkpoint.weights_for_run(cfg.checkpoint.init_from, names, resolved.vocab, resolved.tokenizer_fingerprint, cfg.checkpoint.allow_tokenizer_change, tokenizer)
        model.load_state_dict(state, strict=True)
    rows, fix = untrained
    if fix and not resuming:
        # The rows preflight found, rewritten on the weights this run trains (after any resize).
        from tinytrain.embedding_health import fix_rows, vocab_tables

        fix_rows(vocab_tables(model), rows, resolved.vocab.true, noisy=fix == "noisy_mean", seed=cfg.seed)
    if fast.liger:
        from tinytrain.liger import apply_kernels

        apply_kernels(model, cfg.model.arch)
    if fast.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if fast.compile:
        model.compile()  # in place: parameter names (and so checkpoints) stay unchanged
    strategy = cfg.parallel.strategy
    return CausalLMModule(
        model,
        cfg.trainer,
        resolved.vocab.true,
        checkpoint.metadata(resolved.vocab, resolved.tokenizer_fingerprint, cfg.model.name),
        parallelize=parallelize if strategy == Strategy.fsdp_tp else None,
        clip_in_module=strategy != Strategy.deepspeed,
        cpu_adam=strategy == Strategy.deepspeed and cfg.parallel.offload_optimizer,
        fused_adamw=fast.fused_adamw,
        loss_chunk_tokens=fast.loss_chunk_tokens,
        liger_loss=fast.liger_loss,
    )


def guard_callbacks(cfg, run_dir: Path, precision, untrained_rows: list) -> list:
    """`precision`: the PrecisionDecision; the loss-scale guard (and the loss_scale metric) exist
    only where fp16 loss scaling does."""
    from tinytrain.callbacks.grad_spike import GradSpikeMonitor
    from tinytrain.callbacks.loss_scale_guard import LossScaleGuard
    from tinytrain.callbacks.nonfinite_guard import NonFiniteGuard

    g = cfg.guard
    nonfinite = NonFiniteGuard(g.nonfinite.value, g.max_consecutive_skips, run_dir / "checkpoints")
    loss_scale = [LossScaleGuard(g.loss_scale_halvings, precision.loss_scale, untrained_rows, nonfinite)] if precision.loss_scale else []
    return [
        nonfinite,
        *loss_scale,
        GradSpikeMonitor(g.grad_spike_factor, g.grad_spike_warmup, run_dir / "grad_spikes.jsonl"),
    ]


def extra_loggers(cfg, run_dir: Path) -> list:
    """wandb when asked for, with the resolved config and the plan attached (imported only then)."""
    if not cfg.logger.wandb:
        return []
    import json

    from lightning.pytorch.loggers import WandbLogger
    from omegaconf import OmegaConf

    lg = cfg.logger
    config = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
    plan = run_dir / "plan.json"
    if plan.exists():
        config["plan"] = json.loads(plan.read_text())
    return [
        WandbLogger(
            project=lg.wandb_project,
            entity=lg.wandb_entity,
            group=lg.wandb_group,
            tags=list(lg.wandb_tags),
            name=lg.wandb_name or cfg.run.name,
            save_dir=str(run_dir),
            config=config,
            # One wandb run per run directory: a resumed (requeued) run continues its history. A wandb
            # sweep agent names the run it started in WANDB_RUN_ID; that id must be kept.
            id=os.environ.get("WANDB_RUN_ID") or wandb_run_id(cfg.run.name, run_dir),
            resume="allow",
        )
    ]


def end_wandb_run(cfg, failed: bool) -> None:
    """A local multirun trains its jobs in one process, and Lightning's WandbLogger logs into a
    wandb run that is still open: each job's run ends with the job."""
    if not cfg.logger.wandb:
        return
    import wandb

    if wandb.run is not None:
        wandb.finish(exit_code=1 if failed else 0)


def wandb_run_id(run_name: str, run_dir: Path) -> str:
    """Stable for a run directory, distinct between directories (wandb ids are unique per project)."""
    import hashlib
    import re

    where = hashlib.sha1(str(run_dir.resolve()).encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_-]', '-', run_name)[:48]}-{where}"


def build_trainer(
    cfg, run_dir: Path, resolved: Resolved, shape: ModelShape, deepspeed_config: dict | None, untrained_rows=(), train_sampler=None, extra_callbacks=(), resume_step: int | None = None, preemption=None
):
    """The Lightning Trainer every tinytrain run uses (benchmarks/step_overhead.py times this one).
    `resume_step`: the step of the checkpoint this run resumes from (metrics.csv keeps the rows before it)."""
    import lightning.pytorch as pl

    from tinytrain.callbacks.data_position import DataPosition
    from tinytrain.callbacks.loss_summary import LossSummary
    from tinytrain.callbacks.preemption import Preemption
    from tinytrain.callbacks.rng_state import RNGState
    from tinytrain.callbacks.step_checkpoints import StepCheckpoints
    from tinytrain.callbacks.throughput import ThroughputMonitor, peak_tflops
    from tinytrain.checkpoint_io import AtomicCheckpointIO
    from tinytrain.metrics_csv import ResumableCSVLogger
    from tinytrain.slurm import cluster_plugins
    from tinytrain.strategy import build_trainer_hardware

    t = cfg.trainer
    b = resolved.batch
    hw = build_trainer_hardware(cfg, resolved.precision, not resolved.hardware.is_cpu, devices_per_node(cfg), b.data_parallel, deepspeed_config)
    summary = LossSummary()
    throughput = ThroughputMonitor(shape, *peak_tflops(resolved.hardware, resolved.precision.value))
    callbacks = [
        throughput,
        summary,
        *guard_callbacks(cfg, run_dir, resolved.precision, list(untrained_rows)),
        *([DataPosition(train_sampler)] if train_sampler is not None else []),
        RNGState(),
        # After DataPosition: a checkpoint it saves has counted the step's batch.
        preemption or Preemption(run_dir),
        # Checkpoint callbacks run last (Lightning orders them so).
        StepCheckpoints(run_dir / "checkpoints", t.checkpoint_every_n_steps, cfg.checkpoint.keep_last),
        *extra_callbacks,
    ]
    plugins = [*cluster_plugins(), AtomicCheckpointIO()]
    if not isinstance(hw.precision, str):
        plugins.append(hw.precision)
    trainer = pl.Trainer(
        accelerator=hw.accelerator,
        devices=hw.devices,
        num_nodes=hw.num_nodes,
        strategy=hw.strategy,
        precision=hw.precision if isinstance(hw.precision, str) else None,
        plugins=plugins,
        max_steps=t.max_steps,
        accumulate_grad_batches=b.accumulate_grad_batches,
        val_check_interval=t.val_every_n_steps * b.accumulate_grad_batches,
        check_val_every_n_epoch=None,
        limit_val_batches=t.val_batches,
        num_sanity_val_steps=0,
        log_every_n_steps=t.log_every_n_steps,
        logger=[ResumableCSVLogger(run_dir, resume_step), *extra_loggers(cfg, run_dir)],
        callbacks=callbacks,
        enable_progress_bar=t.progress_bar,
        enable_model_summary=False,
        default_root_dir=str(run_dir),
        # The batch sampler shards by data-parallel rank itself (DataPosition.setup), resumably.
        use_distributed_sampler=False,
    )
    return trainer, throughput, summary


def fit(cfg, run_dir: Path, tokenizer, resolved: Resolved, model_config, attention, deepspeed_config: dict | None, shape: ModelShape, fast: FastPaths, untrained: tuple = ([], ""), resume=None) -> dict:
    """`resume`: the ResumePoint (tinytrain/resume.py) to continue from, or None for a fresh start."""
    import lightning.pytorch as pl

    from tinytrain.callbacks.preemption import Preemption
    from tinytrain.data.datamodule import DataModule

    preemption = Preemption(run_dir)
    preemption.install_early()  # a SIGUSR1 while the data is built is honoured at the first step
    quiet_lightning()
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    # Data first: bad data is reported before weights are allocated.
    data = DataModule(cfg.data, tokenizer, resolved.batch.micro_batch_size, cfg.seed, data_parallel=resolved.batch.data_parallel)
    log.info("%s", data.describe())
    from tinytrain import preflight

    preflight.report(preflight.data_findings(cfg, data.stores, resolved.vocab.true))
    untrained_rows, untrained_fix = untrained
    module = build_module(cfg, resolved, tokenizer, model_config, attention, fast, untrained, resuming=resume is not None)
    # Rows the preflight was told to leave alone are what the loss-scale guard will name.
    from tinytrain.callbacks.samples import sample_callback

    trainer, throughput, summary = build_trainer(
        cfg,
        run_dir,
        resolved,
        shape,
        deepspeed_config,
        [] if untrained_fix else untrained_rows,
        data.train_sampler,
        extra_callbacks=sample_callback(cfg, run_dir, tokenizer, resolved.vocab.true),
        resume_step=resume and resume.step,
        preemption=preemption,
    )
    final = run_dir / "checkpoints" / "final.ckpt"
    failed = True
    try:
        # Raises Preempted (callbacks/preemption.py) after a signal: no final checkpoint, no export.
        trainer.fit(module, train_dataloaders=data.train_dataloader(), val_dataloaders=data.val_dataloader(), ckpt_path=resume and str(resume.path))
        # Every rank takes part: under fsdp_tp the full tensors are gathered to rank 0 first.
        trainer.save_checkpoint(final)
        failed = False
    finally:
        end_wandb_run(cfg, failed)
    val_loss = trainer.callback_metrics.get("val_loss")
    result = {
        "first_loss": summary.first,
        "last_loss": summary.last,
        "val_loss": float(val_loss) if val_loss is not None else None,
        **throughput.summary(),
    }
    if trainer.is_global_zero:
        finish(cfg, run_dir, final, model_config, tokenizer, resolved, result)
    return result


def finish(cfg, run_dir: Path, final_checkpoint: Path, model_config, tokenizer, resolved: Resolved, result: dict) -> None:
    from tinytrain.export import export_checkpoint, export_spec
    from tinytrain.plot import plot_loss

    if cfg.trainer.plot and (run_dir / "metrics.csv").exists():
        plot_loss(run_dir / "metrics.csv", run_dir / "loss_curve.png", f"{cfg.model.name} on {cfg.data.name}")
    if cfg.trainer.export:
        if final_checkpoint.is_dir():
            # DeepSpeed writes a folder of partitions: consolidate to one fp32 state dict first.
            from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

            consolidated = final_checkpoint.with_suffix(".consolidated.ckpt")
            convert_zero_checkpoint_to_fp32_state_dict(str(final_checkpoint), str(consolidated))
            final_checkpoint = consolidated
        spec = export_spec(cfg, tokenizer, cfg.export.dtype.value)
        export_checkpoint(final_checkpoint, model_config, tokenizer, resolved.vocab.true, Path(cfg.export.dir or run_dir / "hf_export"), spec)
    val = f", validation {result['val_loss']:.4f}" if result["val_loss"] is not None else ""
    if result["first_loss"] is None:  # resumed from a checkpoint at trainer.max_steps
        print(f"no step left to train (trainer.max_steps={cfg.trainer.max_steps}){val}")
    else:
        print(f"loss {result['first_loss']:.4f} (first step) -> {result['last_loss']:.4f} (last step){val}")
    if result["tokens_per_s_per_device"]:
        mfu = f"MFU {100 * result['mfu']:.1f}% of the {result['note']}" if result["mfu"] is not None else result["note"]
        print(f"throughput {result['tokens_per_s_per_device']:,.0f} tokens/s per device after the first step; {mfu}")
    print(f"run directory: {run_dir}")

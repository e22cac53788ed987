"""Build and fit: tokenizer, model, data, strategy, callbacks, logger -> Lightning Trainer.

Everything here runs after the plan, so configuration problems have already been reported.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tinytrain.resolve import Resolved, devices_per_node

log = logging.getLogger(__name__)


def checkpoint_metadata(cfg, resolved: Resolved, tokenizer) -> dict:
    return {
        "true_vocab": resolved.vocab.true,
        "padded_vocab": resolved.vocab.padded,
        "vocab_multiple": resolved.vocab.multiple,
        "tp": resolved.vocab.tp,
        "tokenizer_fingerprint": resolved.tokenizer_fingerprint,
        "model": cfg.model.name,
    }


def quiet_lightning() -> None:
    """Keep Lightning's own console lines once (not again through Hydra's root handler) and drop
    notices that are not about this run."""
    import warnings

    lightning_log = logging.getLogger("lightning.pytorch")
    lightning_log.propagate = False
    lightning_log.addFilter(lambda record: "Tip:" not in record.getMessage())
    # The CSV logger shares the run directory with plan.json and the resolved config on purpose.
    warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    # Lightning only knows resumable loaders by their state_dict; tinytrain's sampler position is
    # restored by the DataPosition callback instead, so a mid-epoch resume is exact.
    warnings.filterwarnings("ignore", message=r"You're resuming from a checkpoint that ended before the epoch ended")


def fit(cfg, run_dir: Path, tokenizer, resolved: Resolved, model_config, attention) -> dict:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    from tinytrain.callbacks.data_position import DataPosition
    from tinytrain.callbacks.loss_summary import LossSummary
    from tinytrain.callbacks.throughput import TokensPerSecond
    from tinytrain.data.datamodule import DataModule
    from tinytrain.model import build_model
    from tinytrain.module import CausalLMModule
    from tinytrain.strategy import build_trainer_hardware

    quiet_lightning()
    t = cfg.trainer
    b = resolved.batch
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    # Data first: bad data is reported before weights are allocated.
    data = DataModule(cfg.data, tokenizer, b.micro_batch_size, cfg.seed, data_parallel=b.data_parallel)
    log.info("%s", data.describe())
    model = build_model(cfg.model, model_config, attention)
    module = CausalLMModule(model, t, resolved.vocab.true, checkpoint_metadata(cfg, resolved, tokenizer))
    hw = build_trainer_hardware(cfg, resolved.precision, on_gpu=not resolved.hardware.is_cpu, devices=devices_per_node(cfg))
    summary = LossSummary()
    callbacks = [
        TokensPerSecond(),
        summary,
        DataPosition(data.train_sampler),
        # monitor="step" + mode="max" keeps the newest checkpoints; last.ckpt always points at the newest.
        ModelCheckpoint(
            dirpath=run_dir / "checkpoints",
            filename="step{step:07d}",
            auto_insert_metric_name=False,
            every_n_train_steps=t.checkpoint_every_n_steps,
            monitor="step",
            mode="max",
            save_top_k=3,
            save_last=True,
        ),
    ]
    trainer = pl.Trainer(
        accelerator=hw.accelerator,
        devices=hw.devices,
        num_nodes=hw.num_nodes,
        strategy=hw.strategy,
        precision=hw.precision if isinstance(hw.precision, str) else None,
        plugins=None if isinstance(hw.precision, str) else [hw.precision],
        max_steps=t.max_steps,
        accumulate_grad_batches=b.accumulate_grad_batches,
        val_check_interval=t.val_every_n_steps * b.accumulate_grad_batches,
        check_val_every_n_epoch=None,
        limit_val_batches=t.val_batches,
        num_sanity_val_steps=0,
        log_every_n_steps=t.log_every_n_steps,
        logger=CSVLogger(save_dir=str(run_dir), name="", version=""),
        callbacks=callbacks,
        enable_progress_bar=t.progress_bar,
        enable_model_summary=False,
        default_root_dir=str(run_dir),
        # The batch sampler shards by data-parallel rank itself (DataPosition.setup), resumably.
        use_distributed_sampler=False,
    )
    trainer.fit(module, train_dataloaders=data.train_dataloader(), val_dataloaders=data.val_dataloader())
    val_loss = trainer.callback_metrics.get("val_loss")
    result = {
        "first_loss": summary.first,
        "last_loss": summary.last,
        "val_loss": float(val_loss) if val_loss is not None else None,
    }
    if trainer.is_global_zero:
        finish(cfg, run_dir, module, tokenizer, resolved, result)
    return result


def finish(cfg, run_dir: Path, module, tokenizer, resolved: Resolved, result: dict) -> None:
    from tinytrain.export import export_hf
    from tinytrain.plot import plot_loss

    if cfg.trainer.plot and (run_dir / "metrics.csv").exists():
        plot_loss(run_dir / "metrics.csv", run_dir / "loss_curve.png", f"{cfg.model.name} on {cfg.data.name}")
    if cfg.trainer.export:
        export_hf(module.model, tokenizer, resolved.vocab.true, run_dir / "hf_export")
    val = f", validation {result['val_loss']:.4f}" if result["val_loss"] is not None else ""
    print(f"loss {result['first_loss']:.4f} (first step) -> {result['last_loss']:.4f} (last step){val}")
    print(f"run directory: {run_dir}")

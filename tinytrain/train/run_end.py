"""The end of a run, one path for a run that just trained (train/fit.py) and a saved one
(mode=export, mode=average: outputs/modes.py): a checkpoint exported as its format allows
(checkpoint/formats.py: fsdp_tp's shards stream, a DeepSpeed folder is consolidated first) and the
mean of step checkpoints written beside them, then exported like any checkpoint."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tinytrain.checkpoint.average import average_checkpoints, output_path
from tinytrain.checkpoint.deepspeed_weights import consolidate_deepspeed
from tinytrain.checkpoint.export import ExportSpec, export_checkpoint


@dataclass(frozen=True)
class RunModel:
    """What an export of a run's checkpoint needs, from the plan of a run in progress or the saved
    config of a finished one."""

    config: object  # the transformers config the run trained
    tokenizer: object
    true_vocab: int
    spec: ExportSpec
    adapters: dict | None = None  # a LoRA run's: merged into the export, peft's folder beside it


def export_dir_for(checkpoint: Path, run_dir: Path) -> Path:
    """hf_export for final.ckpt, hf_export-<name> for any other checkpoint of the run."""
    name = Path(checkpoint).name.removesuffix(".ckpt")
    return run_dir / ("hf_export" if name == "final" else f"hf_export-{name}")


def export(checkpoint: Path, model: RunModel, out_dir: Path, keep_at: Path | None = None) -> Path:
    """`keep_at`: where a DeepSpeed folder's consolidated weights are kept (the end of training
    keeps final.consolidated.ckpt)."""
    return export_checkpoint(checkpoint, model_config=model.config, tokenizer=model.tokenizer, true_vocab=model.true_vocab, out_dir=out_dir, spec=model.spec, adapters=model.adapters, keep_at=keep_at)


def average(paths: list[Path], folder: Path) -> Path:
    """The mean of `paths` written into `folder` (checkpoint/average.py names it); returns its path."""
    out, _ = average_checkpoints(paths, output_path(paths, folder), consolidate_deepspeed)
    return out

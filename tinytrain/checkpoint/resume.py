"""Resume on disk: a checkpoint's top-level state read safely (a file, or DeepSpeed's folder),
the newest one that loads, and the housekeeping after interrupted saves. Which checkpoint a run
continues from is decided by the plan (tinytrain/plan/start_points.py)."""

from __future__ import annotations

import logging
import math
from pathlib import Path

from tinytrain.checkpoint.files import is_temp, step_checkpoints, temp_writer_alive
from tinytrain.checkpoint.formats import format_of, is_checkpoint
from tinytrain.config.schema import CheckpointConfig, FinetuneMethod, Mode
from tinytrain.errors import ConfigError, MissingExtra, Problem

log = logging.getLogger(__name__)

AUTO, NEVER = "auto", "never"


def read_state(path: Path, key: str = "resume") -> dict:
    """The checkpoint's top-level dict (global_step, tinytrain metadata, ...), memory-mapped and
    read without running code from it, as its format reads it (formats.py): a DeepSpeed folder has
    each file checked first; a sharded (fsdp_tp) folder every rank's shard file of this save, its
    `state_dict` meta tensors of the saved shapes."""
    return format_of(path).read_state(Path(path), key)


def newest_loadable(directory: Path) -> tuple[Path, dict, list[tuple[Path, str]]] | None:
    """The newest step checkpoint that loads, its state, and the newer ones that did not."""
    skipped = []
    for _, path in step_checkpoints(directory):
        try:
            return path, read_state(path), skipped
        except MissingExtra:  # it loads once the package is installed: nothing to skip or rename
            raise
        except ConfigError as e:
            why = e.problems[0].message
            log.warning("resume=auto: %s does not load (%s); trying the one before", path.name, why)
            skipped.append((path, why))
    if skipped:
        # Starting over would silently throw the run away; this needs a person.
        raise ConfigError(
            Problem(
                "resume",
                AUTO,
                f"no step checkpoint in {directory} loads ({skipped[0][0].name}: {skipped[0][1]})",
                "point resume=<path> at a checkpoint that loads, or start over in a new directory (run.name=<new>)",
            )
        )
    return None


def set_aside(unreadable: list[tuple[Path, str]]) -> list[Path]:
    """Rename checkpoints that did not load out of the step-name pattern (kept for inspection), so
    neither pruning nor a later resume mistakes them for this run's newest."""
    moved = []
    for path, _ in unreadable:
        target = path.with_name(path.name + ".unreadable")
        if path.exists():
            path.replace(target)
            moved.append(target)
    return moved


def leftover_temp_files(checkpoint_dir: Path) -> list[Path]:
    """Remove the temp files (or DeepSpeed temp folders) of saves a killed process never finished;
    not one a live process is writing (mode=average beside a resumed run)."""
    if not checkpoint_dir.is_dir():
        return []
    removed = []
    for path in sorted(p for p in checkpoint_dir.iterdir() if is_temp(p) and not temp_writer_alive(p)):
        format_of(path).remove(path)
        removed.append(path)
    return removed


def will_resume(cfg) -> bool:
    """Whether this training run continues from a checkpoint: resume=<path>, or resume=auto with a
    step checkpoint in the run directory (the planner decides which, and whether it loads)."""
    if cfg.mode != Mode.train or cfg.resume == "never":
        return False
    if cfg.resume != "auto":
        return True
    from hydra.core.hydra_config import HydraConfig

    return HydraConfig.initialized() and bool(step_checkpoints(Path(HydraConfig.get().runtime.output_dir) / "checkpoints"))


def checkpoint_problems(cfg) -> list[Problem]:
    problems = []
    path = cfg.checkpoint.init_from
    if path and not is_checkpoint(path) and not will_resume(cfg):  # a resume does not read it (the planner says when it must)
        problems.append(Problem("checkpoint.init_from", path, "no such checkpoint file", "point it at a .ckpt file (or an fsdp_tp or DeepSpeed run's .ckpt folder) from a tinytrain run's checkpoints/ folder"))
    last, keep = cfg.checkpoint.average_last, cfg.checkpoint.keep_last
    averaging = cfg.mode != Mode.average  # mode=average reads the checkpoints there, whatever keep_last was
    if last is not None and (last < 2 or (averaging and last > keep)):
        if last < 2:
            fix = "use checkpoint.average_last=2" + ((" with checkpoint.keep_last=2 (the run keeps what it averages)" if keep < 2 else f" (up to checkpoint.keep_last={keep})") if averaging else "") + ", or checkpoint.average_last=null for no average"
        else:
            # Not "use 2 to <keep_last>": below 2 that range is empty, and a keep_last the user set low is the key to raise.
            fewer = f", or average fewer: checkpoint.average_last={keep}" if keep >= 2 else ""
            fix = f"raise checkpoint.keep_last to at least {last} (checkpoint.keep_last={last}: the run keeps what it averages){fewer}, or checkpoint.average_last=null for no average"
        problems.append(Problem("checkpoint.average_last", last, f"averages the run's newest step checkpoints: at least 2, and at most the checkpoint.keep_last({keep}) the run keeps", fix))
    if last is not None and cfg.mode != Mode.average and cfg.finetune.method != FinetuneMethod.full:
        # checkpoint/average.py refuses adapters at the end of training: say it before the run.
        problems.append(Problem("checkpoint.average_last", last, f"averages step checkpoints, and a finetune={cfg.finetune.method.value} run's hold LoRA adapters: the mean of adapters is not the mean of the merged weights", "use checkpoint.average_last=null with LoRA (export each checkpoint with mode=export), or finetune=full"))
    for key, meaning in (("write_gbps", "the disk's write speed in GB/s, which the plan times each save by"), ("max_save_share", "the share of the time between saves a save may take before the plan warns")):
        value = getattr(cfg.checkpoint, key)
        if not (math.isfinite(value) and value > 0):
            problems.append(Problem(f"checkpoint.{key}", value, f"must be a finite number above 0: {meaning}", f"use e.g. checkpoint.{key}={getattr(CheckpointConfig, key)}"))
    if cfg.checkpoint.keep_last < 1:
        problems.append(Problem("checkpoint.keep_last", cfg.checkpoint.keep_last, "must be >= 1 (resuming needs a checkpoint)", "keep at least 1; 2 or more survive a checkpoint lost to a full disk"))
    resume = cfg.resume
    if resume not in ("auto", "never") and (not str(resume).strip() or not Path(resume).exists()):  # '' is the working directory to Path
        problems.append(
            Problem("resume", resume, "is neither auto, never, nor an existing checkpoint", "use resume=auto (the newest checkpoint of the run directory), resume=never, or the path of a .ckpt file")
        )
    return problems

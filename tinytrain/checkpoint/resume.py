"""Resume on disk: a checkpoint's top-level state read safely (a file, or DeepSpeed's folder),
the newest one that loads, and the housekeeping after interrupted saves. Which checkpoint a run
continues from is decided by the plan (tinytrain/plan/start_points.py)."""

from __future__ import annotations

import logging
from pathlib import Path

from tinytrain.checkpoint.deepspeed_shards import check_shards
from tinytrain.checkpoint.files import is_temp, remove, step_checkpoints
from tinytrain.checkpoint.format import MODULE_PREFIX, read
from tinytrain.checkpoint.safe_load import (
    check_deepspeed_folder,
    deepspeed_globals,
    load_file,
)
from tinytrain.checkpoint.sharded import check_folder, is_sharded, shape_stand_ins
from tinytrain.config.schema import Mode
from tinytrain.errors import ConfigError, Problem

log = logging.getLogger(__name__)

AUTO, NEVER = "auto", "never"
# DeepSpeed saves a folder (Lightning's tag "checkpoint"); its client state (step, tinytrain
# metadata) is in rank 0's model-states file: one per model-parallel rank under ZeRO-1/2, one
# per data-parallel rank under ZeRO-3.
DEEPSPEED_STATE_FILES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")


def read_state(path: Path, key: str = "resume") -> dict:
    """The checkpoint's top-level dict (global_step, tinytrain metadata, ...), memory-mapped and
    read without running code from it; a DeepSpeed folder has each file checked first, since
    DeepSpeed's own loader unpickles anything. A sharded (fsdp_tp) folder is checked for every
    rank's shard file of this save; its `state_dict` holds meta tensors of the saved shapes."""
    if is_sharded(path):
        return {**check_folder(path, key), "state_dict": {MODULE_PREFIX + k: v for k, v in shape_stand_ins(path, key).items()}}
    if path.is_dir():
        check_deepspeed_folder(path, key)
        state_file = deepspeed_state_file(path)
        state = load_file(state_file, key, deepspeed_globals())
        check_shards(path, state, state_file, key)  # every rank's partition, before DeepSpeed reads them
        return state
    return read(str(path), key)


def deepspeed_state_file(folder: Path) -> Path:
    """The file of a DeepSpeed checkpoint folder that holds its client state (the first
    candidate when none exists, so the error names a file that should be there)."""
    candidates = [folder / "checkpoint" / name for name in DEEPSPEED_STATE_FILES]
    return next((c for c in candidates if c.is_file()), candidates[0])


def is_deepspeed_folder(path: Path) -> bool:
    return path.is_dir() and deepspeed_state_file(path).is_file()


def newest_loadable(directory: Path) -> tuple[Path, dict, list[tuple[Path, str]]] | None:
    """The newest step checkpoint that loads, its state, and the newer ones that did not."""
    skipped = []
    for _, path in step_checkpoints(directory):
        try:
            return path, read_state(path), skipped
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
    """Remove the temp files (or DeepSpeed temp folders) of saves a killed process never finished."""
    if not checkpoint_dir.is_dir():
        return []
    removed = []
    for path in sorted(p for p in checkpoint_dir.iterdir() if is_temp(p)):
        remove(path)
        removed.append(path)
    return removed


def checkpoint_problems(cfg) -> list[Problem]:
    problems = []
    path = cfg.checkpoint.init_from
    if path and not (Path(path).is_file() or is_sharded(Path(path)) or is_deepspeed_folder(Path(path))):
        problems.append(Problem("checkpoint.init_from", path, "no such checkpoint file", "point it at a .ckpt file (or an fsdp_tp or DeepSpeed run's .ckpt folder) from a tinytrain run's checkpoints/ folder"))
    last = cfg.checkpoint.average_last
    if last is not None and (last < 2 or (cfg.mode != Mode.average and last > cfg.checkpoint.keep_last)):
        problems.append(Problem("checkpoint.average_last", last, f"averages the run's newest step checkpoints: at least 2, and at most the checkpoint.keep_last({cfg.checkpoint.keep_last}) the run keeps", f"use 2 to {max(2, cfg.checkpoint.keep_last)} (raise checkpoint.keep_last to average more), or null for no average"))
    if cfg.checkpoint.keep_last < 1:
        problems.append(Problem("checkpoint.keep_last", cfg.checkpoint.keep_last, "must be >= 1 (resuming needs a checkpoint)", "keep at least 1; 2 or more survive a checkpoint lost to a full disk"))
    resume = cfg.resume
    if resume not in ("auto", "never") and not Path(resume).exists():
        problems.append(
            Problem("resume", resume, "is neither auto, never, nor an existing checkpoint", "use resume=auto (the newest checkpoint of the run directory), resume=never, or the path of a .ckpt file")
        )
    return problems

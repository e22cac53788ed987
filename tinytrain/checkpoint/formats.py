"""What tinytrain knows about each on-disk checkpoint format, as plan/parallel.py is for strategies:
one row per format says how a path of it is recognised, how its state is read without running code
from it, how its weights are read, what layout it was saved under, how it is removed, and whether
the export streams it. Other modules ask `format_of(path)` instead of looking at the path.

A new format is a `CheckpointFormat` member, a row here and its writer (train/: atomic_io.py for a
file, sharded_checkpoints.py for fsdp_tp's folder, strategy.py for DeepSpeed's);
tests/unit/checkpoint/test_formats.py fails while a row lacks an entry, and when another module
decides a format from a path.

No Lightning here: the planning stage reads checkpoints. A DeepSpeed folder's weights are
consolidated through Lightning's converter, imported only then (deepspeed_weights.py).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable

from tinytrain.checkpoint.deepspeed_shards import check_shards
from tinytrain.checkpoint.format import MODULE_PREFIX, module_weights
from tinytrain.checkpoint.safe_load import check_deepspeed_folder, deepspeed_globals, load_file
from tinytrain.checkpoint.sharded import INDEX_FILE, META_FILE, SAVE_ID_KEY, check_folder, consolidated_weights, shape_stand_ins
from tinytrain.errors import ConfigError, Problem


class CheckpointFormat(Enum):
    """What a checkpoint is on disk (a strategy's own is its row's in plan/parallel.py)."""

    file = "file"  # one full .ckpt file, vocab rows unpadded (fsdp_tp's before sharded checkpoints)
    sharded = "sharded"  # a torch.distributed.checkpoint folder, every rank its own shards (checkpoint/sharded.py); async saves possible
    deepspeed = "deepspeed"  # DeepSpeed's folder of ZeRO partitions, published atomically
    hf_export = "hf_export"  # a Hugging Face folder the export wrote: weights, no training state


@dataclass(frozen=True)
class FormatRow:
    format: CheckpointFormat
    recognises: Callable[[Path], bool]  # asked in table order: the first row that says yes is the path's format
    complete: Callable[[Path], bool]  # holds what its reader starts from (checkpoint.init_from is checked by it)
    training_state: bool  # step, optimizer state and tinytrain metadata: a run resumes or starts from it
    read_state: Callable[[Path, str], dict]  # (path, key) -> the top-level dict, read safely; `key` names the setting in an error
    read_weights: Callable[..., dict]  # (path, key, keep_at=None) -> the HF model's weights (`model.` prefix removed)
    saved_layout: Callable[[Path, dict], dict]  # (path, state) -> plan/layout_change.Layout's fields, read from the disk
    remove: Callable[[Path], None]
    streams_export: bool  # its weights are read one tensor at a time: the export never holds the model


def remove_folder(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def saved_tp(state: dict) -> int:
    return int((state.get("tinytrain") or {}).get("tp", 1))


# -- file: one torch.save'd dict (single, ddp; fsdp_tp before it saved sharded)


def file_weights(path: Path, key: str, keep_at: Path | None = None) -> dict:
    return module_weights(load_file(path, key)["state_dict"])


def file_layout(path: Path, state: dict) -> dict:
    return {"format": "file", "strategy": "unknown", "world": 1, "dp": 1, "tp": saved_tp(state)}


def remove_file(path: Path) -> None:
    path.unlink(missing_ok=True)


# -- sharded: fsdp_tp's DCP folder (checkpoint/sharded.py has its layout)


def is_sharded_folder(path: Path) -> bool:
    return path.is_dir() and ((path / META_FILE).exists() or (path / INDEX_FILE).exists())


def sharded_state(path: Path, key: str) -> dict:
    """Every rank's shard file of this save checked; `state_dict` holds meta tensors of the saved shapes."""
    return {**check_folder(path, key), "state_dict": {MODULE_PREFIX + k: v for k, v in shape_stand_ins(path, key).items()}}


def sharded_weights(path: Path, key: str, keep_at: Path | None = None) -> dict:
    return consolidated_weights(path, key)


def sharded_layout(path: Path, state: dict) -> dict:
    tp = saved_tp(state)
    world = int(state.get(SAVE_ID_KEY, {}).get("ranks", tp))
    return {"format": "sharded", "strategy": "fsdp_tp", "world": world, "dp": world // tp, "tp": tp}


# -- deepspeed: DeepSpeed's folder (Lightning's tag "checkpoint"); its client state (step, tinytrain
# metadata) is in rank 0's model-states file: one per model-parallel rank under ZeRO-1/2, one per
# data-parallel rank under ZeRO-3.

DEEPSPEED_STATE_FILES = ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_model_states.pt")


def deepspeed_state_file(folder: Path) -> Path:
    """The file of a DeepSpeed checkpoint folder that holds its client state (the first
    candidate when none exists, so the error names a file that should be there)."""
    candidates = [folder / "checkpoint" / name for name in DEEPSPEED_STATE_FILES]
    return next((c for c in candidates if c.is_file()), candidates[0])


def deepspeed_state(path: Path, key: str) -> dict:
    """Each file checked first, since DeepSpeed's own loader unpickles anything."""
    check_deepspeed_folder(path, key)
    state_file = deepspeed_state_file(path)
    state = load_file(state_file, key, deepspeed_globals(path, key))
    check_shards(path, state, state_file, key)  # every rank's partition, before DeepSpeed reads them
    return state


def deepspeed_weights(path: Path, key: str, keep_at: Path | None = None) -> dict:
    """Consolidated to one fp32 file first: kept at `keep_at` when given (the end of a run keeps
    final.consolidated.ckpt), else through a temp file."""
    from tinytrain.checkpoint.deepspeed_weights import consolidate_deepspeed, deepspeed_checkpoint

    check_deepspeed_folder(path, key)  # Lightning's converter unpickles every file it reads
    if keep_at is None:
        return module_weights(deepspeed_checkpoint(path, key)["state_dict"])
    consolidate_deepspeed(path, keep_at)
    return file_weights(keep_at, key)


def deepspeed_layout(path: Path, state: dict) -> dict:
    partitions = len(list(path.glob("checkpoint/*optim_states.pt")))
    stage = 3 if list(path.glob("checkpoint/zero_pp_rank_*_model_states.pt")) else 2  # 1 and 2 save alike
    return {"format": "deepspeed", "strategy": "deepspeed", "world": partitions, "dp": partitions, "tp": 1, "zero_stage": stage}


# -- hf_export: a Hugging Face folder (config.json beside safetensors weights), what mode=export writes

HF_CONFIG = "config.json"


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / HF_CONFIG).is_file()


def no_training_state(path: Path, key: str) -> dict:
    raise ConfigError(
        Problem(
            key,
            str(path),
            "is a Hugging Face folder (an export): it holds weights, no step, optimizer state or tinytrain metadata",
            "start from its weights with model.pretrained=<folder>, or point at a checkpoint: <run>/checkpoints/step<N>.ckpt",
        )
    )


def no_layout(path: Path, state: dict) -> dict:
    return no_training_state(path, "resume")


def hf_weights(path: Path, key: str, keep_at: Path | None = None) -> dict:
    from safetensors.torch import load_file as load_safetensors

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ConfigError(Problem(key, str(path), "is a Hugging Face folder without safetensors weights", "export the checkpoint again (mode=export)"))
    return {k: v for f in files for k, v in load_safetensors(str(f)).items()}


FORMATS: dict[CheckpointFormat, FormatRow] = {
    CheckpointFormat.sharded: FormatRow(
        CheckpointFormat.sharded,
        recognises=is_sharded_folder,
        complete=is_sharded_folder,
        training_state=True,
        read_state=sharded_state,
        read_weights=sharded_weights,
        saved_layout=sharded_layout,
        remove=remove_folder,
        streams_export=True,
    ),
    CheckpointFormat.hf_export: FormatRow(
        CheckpointFormat.hf_export,
        recognises=is_hf_folder,
        complete=is_hf_folder,
        training_state=False,
        read_state=no_training_state,
        read_weights=hf_weights,
        saved_layout=no_layout,
        remove=remove_folder,
        streams_export=False,
    ),
    CheckpointFormat.deepspeed: FormatRow(
        CheckpointFormat.deepspeed,
        recognises=lambda path: path.is_dir(),  # any other folder: its reader names what is missing
        complete=lambda path: path.is_dir() and deepspeed_state_file(path).is_file(),
        training_state=True,
        read_state=deepspeed_state,
        read_weights=deepspeed_weights,
        saved_layout=deepspeed_layout,
        remove=remove_folder,
        streams_export=False,
    ),
    CheckpointFormat.file: FormatRow(
        CheckpointFormat.file,
        recognises=lambda path: True,  # anything else, a missing path too: its reader names the problem
        complete=lambda path: path.is_file(),
        training_state=True,
        read_state=lambda path, key: load_file(path, key),
        read_weights=file_weights,
        saved_layout=file_layout,
        remove=remove_file,
        streams_export=False,
    ),
}


def format_of(path: Path | str) -> FormatRow:
    """The row of the format `path` is in (the file row when nothing else recognises it)."""
    path = Path(path)
    return next(row for row in FORMATS.values() if row.recognises(path))


def is_checkpoint(path: Path | str) -> bool:
    """A complete checkpoint a run can start from (not an export: that holds no training state)."""
    row = format_of(path)
    return row.training_state and row.complete(Path(path))


def saved_layout(path: Path, state: dict) -> dict:
    """The layout a checkpoint was saved under: its metadata's, else read from the disk."""
    meta = state.get("tinytrain") or {}
    if "layout" in meta:
        return dict(meta["layout"])
    return format_of(path).saved_layout(Path(path), state)

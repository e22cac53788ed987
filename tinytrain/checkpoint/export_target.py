"""Where an export goes and what an export folder must hold, checked without loading anything.

Exports are published like checkpoints (export.export_folder): written to `<dir>.tmp-<pid>` and
renamed onto `<dir>` when complete. A temp sibling left behind is an export that was killed; a
folder with config.json but no weights or tokenizer was cut short by a version that wrote in place.
"""

from __future__ import annotations

import os
from pathlib import Path

from tinytrain.checkpoint.files import temp_siblings
from tinytrain.checkpoint.weight_files import weight_problems
from tinytrain.errors import Problem

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")


def interrupted_exports(out_dir: Path) -> list[Path]:
    """Temp folders an export into `out_dir` left when it was killed (or a replaced export not yet deleted)."""
    return [p for p in temp_siblings(out_dir) if p.is_dir()]


def model_files_missing(folder: Path) -> list[str]:
    """What a Hugging Face folder lacks of the model itself: its config and whole weights."""
    return ([] if (folder / "config.json").is_file() else ["config.json"]) + weight_problems(folder)


def incomplete(folder: Path) -> list[str]:
    """What a Hugging Face folder lacks to serve as a model ([] when complete)."""
    missing = model_files_missing(folder)
    if not any((folder / name).is_file() for name in TOKENIZER_FILES):
        missing.append("a tokenizer (tokenizer.json or tokenizer.model)")
    return missing


def export_folder_problems(key: str, folder: Path) -> list[Problem]:
    """An export (or HF folder) that generate/eval would read, named when it is not whole."""
    folder = Path(folder)
    left = interrupted_exports(folder)
    note = f"; {left[0].name} next to it is an export that was interrupted" if left else ""
    if not folder.exists():
        if left:
            return [Problem(key, str(folder), f"does not exist{note}", "export again (mode=export checkpoint=<run>/checkpoints/final.ckpt), or give another folder")]
        return []
    missing = incomplete(folder)
    if not missing:
        return []
    return [
        Problem(
            key,
            str(folder),
            f"is not a complete Hugging Face model folder ({'; '.join(missing)}){note}",
            "export it again from its checkpoint (mode=export checkpoint=<run>/checkpoints/final.ckpt export.dir=<folder>), or copy the missing files from the model's source",
        )
    ]


def partial_export_problems(key: str, folder: Path) -> list[Problem]:
    """A folder holding an export's tokenizer or weights but no config.json (so not read as an
    export): named as the incomplete export it is, not as a checkpoint outside its run."""
    folder = Path(folder)
    if (folder / "config.json").exists() or not (any((folder / n).is_file() for n in TOKENIZER_FILES) or any(folder.glob("*.safetensors"))):
        return []
    return [Problem(key, str(folder), f"is not a complete Hugging Face model folder ({'; '.join(incomplete(folder))})", "export it again from its checkpoint (mode=export checkpoint=<run>/checkpoints/final.ckpt export.dir=<folder>), or copy the missing files from the model's source")]


def export_dir_problems(key: str, out_dir: Path) -> list[Problem]:
    """Where an export will be published: replaced whole, so never a file or a folder of other things."""
    out_dir = Path(out_dir)
    if out_dir.is_file():
        return [Problem(key, str(out_dir), "is a file; an export is a folder", f"choose a folder path (e.g. {key}={out_dir}_hf), or move the file away")]
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / "config.json").is_file():
        return [Problem(key, str(out_dir), "holds files that are not an export, and an export replaces the whole folder", f"choose a new or empty folder (e.g. {key}={out_dir / 'hf_export'}), or an earlier export to replace")]
    parent = next((p for p in (out_dir, *out_dir.parents) if p.exists()), None)
    if parent is not None and not parent.is_dir():
        return [Problem(key, str(out_dir), f"{parent} is a file, so no folder can be made there", "choose a path under a folder")]
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        return [Problem(key, str(out_dir), f"{parent} is not writable", "choose a folder you can write to")]
    return []

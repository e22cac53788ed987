"""Checkpoint files are read without running code from them.

`torch.load(weights_only=False)` unpickles whatever a file holds, and a pickle can call any
function: a checkpoint from elsewhere could run code on the login node. Every loader in tinytrain
reads with `weights_only=True`, which admits tensors and plain containers only, plus the few
classes DeepSpeed pickles into its own shards (DEEPSPEED_GLOBALS). Anything else is refused with
the name of what the file holds. DeepSpeed loads its shard folders with weights_only=False itself,
so a folder is checked file by file before DeepSpeed sees it (memory-mapped: the tensors are not read).
"""

from __future__ import annotations

import pickle
import re
from pathlib import Path

import torch

from tinytrain.errors import ConfigError, MissingExtra, Problem

UNSUPPORTED_GLOBAL = re.compile(r"(?:Unsupported global: GLOBAL|unsupported GLOBAL) ([\w.]+)")


def deepspeed_globals(folder: Path, key: str) -> list:
    """What DeepSpeed 0.19 pickles into a ZeRO checkpoint besides tensors (found by loading the
    shards of every zero* option in fp32, bf16 and fp16). Without DeepSpeed installed its folder
    cannot be read: named (it was a ModuleNotFoundError traceback)."""
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:
        consolidated = folder.parent / "final.consolidated.ckpt"  # a finished DeepSpeed run's, in checkpoints/
        other = f", or use {consolidated} (the run's final weights, whole)" if consolidated.is_file() else ""
        raise MissingExtra(Problem(key, str(folder), "is a DeepSpeed checkpoint folder, and DeepSpeed is not installed here", f"pip install 'tinytrain-llm[deepspeed]'{other}"))
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def load_file(path: Path | str, key: str, allowed: list | None = None) -> dict:
    """A checkpoint file's dict, memory-mapped. `key` names the setting that pointed at it."""
    try:
        with torch.serialization.safe_globals(allowed or []):
            ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        found = UNSUPPORTED_GLOBAL.search(str(e))
        what = f"it pickles {found.group(1)}" if found else "it holds objects other than tensors and plain containers"
        raise ConfigError(
            Problem(
                key,
                str(path),
                f"refused: {what}, which tinytrain never saves; loading it could run code from the file",
                "use a checkpoint saved by tinytrain, or a Hugging Face folder (safetensors) through model.pretrained",
            )
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        if "mmap can only be used" in str(e) or "failed finding central directory" in str(e):
            # torch's message for a file that is not its zip format talks about mmap.
            raise ConfigError(Problem(key, str(path), "cannot read checkpoint: not a PyTorch checkpoint file (not torch.save's zip format)", "point it at a .ckpt file (or DeepSpeed checkpoint folder) saved by tinytrain")) from e
        raise ConfigError(Problem(key, str(path), f"cannot read checkpoint: {' '.join(str(e).split())[:300]}", "point it at a checkpoint saved by tinytrain")) from e
    if not isinstance(ckpt, dict):
        raise ConfigError(Problem(key, str(path), f"is not a checkpoint: it holds a {type(ckpt).__name__}, not a dict", "point it at a checkpoint saved by tinytrain"))
    return ckpt


def check_deepspeed_tag(folder: Path, key: str) -> None:
    """The folder's `latest` names the sub-folder DeepSpeed and Lightning's converter load (they
    join it to the folder and unpickle what is there): a tag of `../..` had them load files that no
    check below had read. Only a folder directly inside this one is admitted."""
    latest = folder / "latest"
    if not latest.is_file():
        return
    tag = latest.read_text(errors="replace").strip()
    inside = bool(tag) and tag not in (".", "..") and not any(sep in tag for sep in ("/", "\\")) and (folder / tag).resolve().parent == folder.resolve()
    if not inside:
        raise ConfigError(
            Problem(
                key,
                str(latest),
                f"names the sub-folder {tag[:100]!r}, which is not a folder of this checkpoint: DeepSpeed would load its files from elsewhere",
                "use a DeepSpeed checkpoint folder saved by tinytrain (its latest file names checkpoint, the folder beside it)",
            )
        )


def check_deepspeed_folder(folder: Path, key: str) -> None:
    """Every .pt file of a DeepSpeed checkpoint folder holds only what DeepSpeed itself saves."""
    check_deepspeed_tag(folder, key)
    files = sorted(folder.rglob("*.pt"))
    if not files:
        steps = sorted((folder / "checkpoints").glob("step*.ckpt")) or sorted(folder.glob("step*.ckpt"))
        if steps:  # a run directory (or its checkpoints/) given for one of its checkpoints
            raise ConfigError(Problem(key, str(folder), "is a folder of step checkpoints, not one checkpoint", f"name one of them ({key}={steps[-1]}, the newest), or run in that run's directory (its run.name) with resume=auto"))
        raise ConfigError(Problem(key, str(folder), "is a folder without DeepSpeed checkpoint files (*.pt)", "point it at a checkpoint file (checkpoints/step<N>.ckpt, final.ckpt), or a DeepSpeed checkpoint folder saved under parallel=zero*"))
    allowed = deepspeed_globals(folder, key)
    for path in files:
        load_file(path, key, allowed)


PICKLED_WEIGHTS_FIX = "convert the weights to safetensors from a trusted source (where the model is trusted: save_pretrained(folder, safe_serialization=True)), or download the model's .safetensors files instead of pytorch_model.bin"


def pickled_weights_problem(path: Path) -> str | None:
    """Why a pytorch_model*.bin cannot be loaded as weights only (None when it holds tensors and
    plain containers). Memory-mapped, so the tensors are not read; a file in torch's legacy
    (non-zip) format cannot be mapped and is left to the load (pickled_weights_refusal)."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return None
    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as e:
        return pickled_weights_message(path, e)
    except (OSError, RuntimeError, EOFError, ValueError) as e:
        return f"{Path(path).name} does not read as a PyTorch weights file ({' '.join(str(e).split())[:200]})"
    return None


def pickled_weights_message(path: Path | str, error: pickle.UnpicklingError) -> str:
    found = UNSUPPORTED_GLOBAL.search(str(error))
    what = f" (it pickles {found.group(1)})" if found else ""
    return f"{Path(path).name} holds something other than tensors{what}, which loading could run as code"

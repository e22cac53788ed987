"""A Hugging Face model (model.pretrained: a local folder or a hub id), read without building the
model: its config and its embedding / lm_head tables (for the plan and preflight).

A hub id goes through the hub cache (HF_HOME, HF_HUB_CACHE) as transformers' from_pretrained
does: planning reads only its config.json (a login node plans in seconds); training downloads
the weights first (`download_weights`), so preflight sees the same tables as for a folder.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

import torch

from tinytrain.checkpoint.remote_code import announce
from tinytrain.checkpoint.weight_files import INDEX, index_weight_map
from tinytrain.errors import ConfigError, Problem

log = logging.getLogger(__name__)
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")  # org/name, as on huggingface.co
HUB_FILES = ["*.json", "*.safetensors", "tokenizer.model", "*.txt"]  # config, weights, tokenizer


def is_hub_id(value: str) -> bool:
    """`org/name` where no such local path exists: the hub (its cache) has it."""
    return HUB_ID.fullmatch(value) is not None and not Path(value).exists()


def hub_problem(path: str, error: Exception) -> Problem:
    reason = " ".join(str(error).split())[:300]
    return Problem(
        "model.pretrained",
        path,
        f"not a local folder, and the hub id is not in the Hugging Face cache nor downloadable from here ({type(error).__name__}: {reason})",
        "download it where the hub is reachable (huggingface-cli download <id>) into the cache this machine reads (HF_HOME), or point model.pretrained at a local folder",
    )


def pretrained_config(path: str, trust_remote_code: bool = False):
    from transformers import AutoConfig

    if trust_remote_code:
        announce("model.pretrained", local_folder(path))
    from huggingface_hub.errors import StrictDataclassError

    try:
        return AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    # broken JSON, no model_type, an unknown architecture, a field of the wrong type; a hub id not cached offline
    except (OSError, ValueError, KeyError, TypeError, StrictDataclassError) as e:
        if is_hub_id(path):
            raise ConfigError(hub_problem(path, e)) from e
        raise ConfigError(
            Problem("model.pretrained", path, f"cannot read its config.json: {' '.join(str(e).split())[:300]}", "point model.pretrained at a folder written by save_pretrained (config.json + weights)")
        ) from e


def download_weights(path: str) -> None:
    """A hub id's config, tokenizer and safetensors into the hub cache (nothing for a local folder),
    before preflight reads the embedding tables and the model is built from the same files."""
    if not is_hub_id(path):
        return
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(path, allow_patterns=HUB_FILES)
    except Exception as e:  # noqa: BLE001 - offline, unknown repo, gated, no network: all one answer
        raise ConfigError(hub_problem(path, e)) from e


def local_folder(path: str) -> Path | None:
    """The folder holding model.pretrained's files: itself, or a hub id's cached snapshot (None
    when nothing is cached)."""
    if not is_hub_id(path):
        return Path(path)
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(path, allow_patterns=HUB_FILES, local_files_only=True))
    except Exception:  # noqa: BLE001 - not cached
        return None


def pretrained_tables(folder: str) -> dict[str, torch.Tensor]:
    """The input-embedding and lm_head tables of a HF model, read alone from safetensors (no
    model is built), keyed like vocab_tables(); empty for a hub id whose weights are not cached."""
    from safetensors import safe_open

    root = local_folder(folder)
    if root is None or not any(root.glob("*.safetensors")):
        if is_hub_id(folder):  # mode=plan fetched only its config.json
            log.info("%s: weights not in the hub cache yet; the embedding-row checks run when training downloads them", folder)
        return {}
    index = root / INDEX
    files = index_weight_map(index) if index.exists() else None  # checked in the plan (input_safety)
    wanted = {"model.embed_tokens.weight": "input embeddings", "lm_head.weight": "lm_head"}
    tables = {}
    for key, table in wanted.items():
        file = root / (files[key] if files and key in files else "model.safetensors")
        if not file.exists():
            continue
        with safe_open(str(file), framework="pt") as f:
            if key in f.keys():
                tables[table] = f.get_tensor(key)
    return tables


def pretrained_path_problems(pretrained: str | None) -> list[Problem]:
    """model.pretrained: a hub id (checked when its config is read) or a local folder with a config.json."""
    if pretrained and not is_hub_id(pretrained) and not (Path(pretrained) / "config.json").is_file():
        return [Problem("model.pretrained", pretrained, "no config.json there", "point model.pretrained at a local Hugging Face model folder (save_pretrained output), or a hub id (org/name)")]
    return []

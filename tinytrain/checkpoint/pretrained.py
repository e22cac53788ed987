"""A local Hugging Face model folder (model.pretrained), read without building the model: its
config and its embedding / lm_head tables (for the plan and preflight)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from tinytrain.errors import ConfigError, Problem


def pretrained_config(path: str):
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:  # broken JSON, no model_type, an unknown architecture
        raise ConfigError(
            Problem("model.pretrained", path, f"cannot read its config.json: {' '.join(str(e).split())[:300]}", "point model.pretrained at a folder written by save_pretrained (config.json + weights)")
        ) from e


def pretrained_tables(folder: str) -> dict[str, torch.Tensor]:
    """The input-embedding and lm_head tables of a local HF model, read alone from safetensors
    (no model is built), keyed like vocab_tables()."""
    from safetensors import safe_open

    root = Path(folder)
    index = root / "model.safetensors.index.json"
    files = json.loads(index.read_text())["weight_map"] if index.exists() else None
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

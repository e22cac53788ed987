"""The data keys checked together before anything is built (plan/validate.py gathers them with
the other stages' checks): lengths, the split, the format against its source, the store, the
paths (data/sources.py), a mixture's entries (data/mixture.py) and the chat template."""

from __future__ import annotations

from pathlib import Path

from tinytrain.config.schema import DataFormat
from tinytrain.data.chat_templates import chat_template_problems
from tinytrain.data.mixture import mixture_problems
from tinytrain.data.sources import RECORD_SOURCES, source_path_problems
from tinytrain.errors import Problem


def data_problems(cfg) -> list[Problem]:
    d = cfg.data
    problems = []
    if d.seq_len < 2:
        problems.append(Problem("data.seq_len", d.seq_len, "must be >= 2", "use e.g. data.seq_len=256"))
    max_pos = cfg.model.max_position_embeddings
    # With RoPE scaling (or a pretrained model's config) preflight's positions check decides.
    if not cfg.model.pretrained and not cfg.model.rope_scaling and d.seq_len > max_pos:
        problems.append(Problem("data.seq_len", d.seq_len, f"longer than model.max_position_embeddings({max_pos})", f"use data.seq_len<={max_pos} or raise model.max_position_embeddings"))
    if d.val_path is None and not 0.0 < d.val_fraction < 1.0:
        problems.append(Problem("data.val_fraction", d.val_fraction, "must be between 0 and 1", "use e.g. data.val_fraction=0.05, or a separate data.val_path"))
    sft = d.format != DataFormat.text
    if sft and d.source not in RECORD_SOURCES:
        problems.append(Problem("data.format", d.format.value, f"SFT records come from jsonl, parquet or hf sources, not data.source={d.source.value}", "set data.source=jsonl (or parquet, hf)"))
    if d.store and sft:
        problems.append(Problem("data.store", d.store, f"a token store holds pretraining text, but data.format={d.format.value} (SFT data is tokenized at the start of each run)", "remove data.store"))
    elif d.store and not (Path(d.store) / "meta.json").is_file():
        problems.append(Problem("data.store", d.store, "not a token store (no meta.json there)", "point it at a store folder printed by mode=prepare, or remove data.store to use the cache"))
    elif not d.store and not d.sources:
        problems += source_path_problems(d.source, d.path, "data.path")
    if d.sources:
        problems += mixture_problems(cfg)
    elif d.val_path is not None:
        problems += source_path_problems(d.source, d.val_path, "data.val_path")
    for key in ("num_workers", "tokenize_workers"):
        value = getattr(d, key)
        if value is not None and value < 0:
            problems.append(Problem(f"data.{key}", value, "must be >= 0", "use 0 to work in the training process"))
    if d.pad_to_multiple_of < 1:
        problems.append(Problem("data.pad_to_multiple_of", d.pad_to_multiple_of, "must be >= 1", "use 8 (the default) or 1 for no rounding"))
    return problems + chat_template_problems(cfg)

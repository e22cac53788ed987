"""The data keys checked together before anything is built (plan/validate.py gathers them with
the other stages' checks): lengths, the split, the format against its source, the store, the
paths (data/sources.py), a mixture's entries (data/mixture.py) and the chat template."""

from __future__ import annotations

import os
from pathlib import Path

from tinytrain.config.schema import DataFormat, Mode
from tinytrain.data import parts, shards
from tinytrain.data.chat_templates import chat_template_problems
from tinytrain.data.mixture import mixture_problems, stage_problems
from tinytrain.data.sources import RECORD_SOURCES, source_path_problems
from tinytrain.errors import ConfigError, Problem


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
    elif d.store and (Path(d.store) / parts.PLAN).is_file() and (parts.missing_parts(Path(d.store)) or not (Path(d.store) / parts.MANIFEST).is_file()):
        # Not built yet, or a part deleted after the build (the manifest outlives it).
        missing = parts.missing_parts(Path(d.store))
        listed, n = ", ".join(str(i) for i, _ in missing) or "none", missing[0][1] if missing else "?"
        when = "deleted since the store was built" if (Path(d.store) / parts.MANIFEST).is_file() else "not built (no manifest.json yet)"
        problems.append(Problem("data.store", d.store, f"incomplete: part(s) {listed} of {n} {when}", parts.rebuild_fix(Path(d.store), missing or [(0, n)])))
    elif d.store and not ((Path(d.store) / "meta.json").is_file() or (Path(d.store) / parts.MANIFEST).is_file()):
        problems.append(Problem("data.store", d.store, "not a token store (no meta.json there)", "point it at a store folder printed by mode=prepare, or remove data.store to use the cache"))
    elif not d.store and not d.sources:
        problems += source_path_problems(d.source, d.path, "data.path")
    if d.sources:
        problems += mixture_problems(cfg)
        problems += stage_problems(cfg)
    elif d.stages:
        problems.append(Problem("data.stages", f"[{len(d.stages)} stage(s)]", "change a mixture's weights, and data.sources names no mixture", "add data.sources=[{path: ..., weight: ...}, ...] (data=mixture), or remove data.stages"))
    elif d.val_path is not None:
        problems += source_path_problems(d.source, d.val_path, "data.val_path")
    for key in ("num_workers", "tokenize_workers"):
        value = getattr(d, key)
        if value is not None and value < 0:
            problems.append(Problem(f"data.{key}", value, "must be >= 0", "use 0 to work in the training process"))
        elif value is not None and value > max_workers():
            # Each is a process (per rank, for data.num_workers): this many would exhaust the node's
            # process table and memory before the first batch.
            problems.append(Problem(f"data.{key}", value, f"starts that many processes{' on every rank' if key == 'num_workers' else ''}, more than this machine's {os.cpu_count()} cores and more than {MAX_WORKERS}", f"use about the cores per rank (e.g. data.{key}=4), or {'0' if key == 'num_workers' else 'null (one per core)'}"))
    problems += part_problems(cfg)
    if d.pad_to_multiple_of < 1:
        problems.append(Problem("data.pad_to_multiple_of", d.pad_to_multiple_of, "must be >= 1", "use 8 (the default) or 1 for no rounding"))
    return problems + chat_template_problems(cfg)


MAX_WORKERS = 256  # allowed anywhere; a machine with more cores allows one per core


def max_workers() -> int:
    return max(MAX_WORKERS, os.cpu_count() or 1)


def part_problems(cfg) -> list[Problem]:
    """data.prepare_parts / data.prepare_part: a file source's token store built in parts."""
    d = cfg.data
    if d.prepare_parts < 1:
        return [Problem("data.prepare_parts", d.prepare_parts, "must be >= 1", "use 1 (one store) or the number of parts to build in parallel")]
    problems = []
    if d.prepare_parts > 1:
        if d.format != DataFormat.text or d.source not in shards.FILE_SOURCES or d.sources or d.store:
            why = "SFT data is not a token store" if d.format != DataFormat.text else "only a file source's token store (data.path of shards) is built in parts"
            problems.append(Problem("data.prepare_parts", d.prepare_parts, why, "use data.prepare_parts=1"))
        elif d.path:
            try:
                n = len(shards.list_shards(d.path, "data.path", d.source))
            except ConfigError:
                n = None  # named by the source's own check
            if n is not None and d.prepare_parts > n:
                problems.append(Problem("data.prepare_parts", d.prepare_parts, f"data.path has {n} shard file(s); a part is at least one file", f"use data.prepare_parts<={n}"))
    if d.prepare_part is not None:
        if cfg.mode != Mode.prepare:
            problems.append(Problem("data.prepare_part", d.prepare_part, f"builds one part and stops; it is for mode=prepare, not mode={cfg.mode.value}", "remove data.prepare_part, or use mode=prepare"))
        if not 0 <= d.prepare_part < d.prepare_parts:
            problems.append(Problem("data.prepare_part", d.prepare_part, f"out of range: data.prepare_parts={d.prepare_parts} makes parts 0..{d.prepare_parts - 1}", f"use data.prepare_part between 0 and {d.prepare_parts - 1}"))
    return problems

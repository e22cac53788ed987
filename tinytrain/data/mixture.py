"""The members of a weighted mixture (data.sources): each entry's name, weight and Source.

An entry's kind is its `source`, or else follows its path's suffix (data/shards.py's table: `.txt`
text, `.jsonl`/`.jsonl.zst`/`.json.gz` JSON Lines, `.parquet` Parquet); anything else (a folder, a
glob, a dataset name) data.source. Its text field is its own
`text_field` or data.text_field; the other reading options (text_split, hf_split, bad_records) are
data's. The name labels the source in the plan, the logs and the checkpoint's data position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from tinytrain.config.schema import DataFormat, DataSource
from tinytrain.data.shards import shard_format
from tinytrain.data.sources import RECORD_SOURCES, Source, source_path_problems
from tinytrain.errors import Problem


@dataclass(frozen=True)
class Member:
    name: str
    weight: float
    source: Source

    @property
    def key(self) -> str:
        """data.sources[i], for messages."""
        return self.source.key.removesuffix(".path")


def kind(entry, data_cfg) -> DataSource:
    if entry.source is not None:
        return entry.source
    fmt = shard_format(Path(entry.path)) if entry.path else None
    return fmt.kind if fmt is not None else data_cfg.source


def default_name(entry, data_cfg) -> str:
    if entry.name:
        return str(entry.name)
    return Path(entry.path).stem if entry.path else kind(entry, data_cfg).value


def members(data_cfg) -> list[Member]:
    """The mixture's members, in order (empty for a single-source run)."""
    out = []
    for i, entry in enumerate(data_cfg.sources):
        src = Source(
            kind=kind(entry, data_cfg),
            path=entry.path,
            key=f"data.sources[{i}].path",
            text_split=data_cfg.text_split,
            text_field=entry.text_field or data_cfg.text_field,
            hf_split=data_cfg.hf_split,
            bad_records=data_cfg.bad_records,
        )
        out.append(Member(default_name(entry, data_cfg), float(entry.weight), src))
    return out


def stage_weights(data_cfg) -> list[tuple[int | None, list[float]]]:
    """data.stages as (until_step, weight of each member in order; 0 for a source not named)."""
    names = [m.name for m in members(data_cfg)]
    return [(stage.until_step, [float(stage.weights.get(n, 0.0)) for n in names]) for stage in data_cfg.stages]


def mixture_problems(cfg) -> list[Problem]:
    """data.sources: each entry a readable source with a positive weight and its own name, and no
    single-source key that would also name training data."""
    d = cfg.data
    problems = []
    for key, why in (("path", "names one source's data while data.sources names a mixture: which to train on is ambiguous"), ("store", "names one token store while data.sources names a mixture: which to train on is ambiguous"), ("val_path", "a mixture splits validation off each source by data.val_fraction")):
        if getattr(d, key):
            problems.append(Problem(f"data.{key}", getattr(d, key), why, f"set data.{key}=null (data=mixture has none), or drop data.sources for one source"))
    names: dict[str, int] = {}
    sft = d.format != DataFormat.text
    for i, entry in enumerate(d.sources):
        key = f"data.sources[{i}]"
        if entry.weight is None:
            problems.append(Problem(f"{key}.weight", None, "is missing; every mixture source needs a weight", f"add one: {{path: {entry.path}, weight: 0.5}} (weights are relative)"))
        elif not (math.isfinite(entry.weight) and entry.weight > 0):
            problems.append(Problem(f"{key}.weight", entry.weight, "must be a positive number (a source is drawn with probability weight / the sum of the weights)", "use e.g. weight: 0.7 and weight: 0.3, or remove the source"))
        source = kind(entry, d)
        if source == DataSource.pydoc and entry.path:
            problems.append(Problem(f"{key}.path", entry.path, "a pydoc source is the embedded corpus and takes no path", f"set {key}.source=text (or jsonl, parquet, hf), or remove the path"))
        elif source != DataSource.pydoc and not entry.path:
            problems.append(Problem(f"{key}.path", entry.path, "is missing; every mixture source needs a file or folder", f"add one: {{path: data.txt, weight: {entry.weight or 0.5}}}"))
        else:
            problems += source_path_problems(source, entry.path, f"{key}.path")
        if sft and source not in RECORD_SOURCES:
            problems.append(Problem(f"{key}.source", source.value, f"SFT records (data.format={d.format.value}) come from jsonl, parquet or hf sources", f"point {key}.path at a .jsonl file, or set {key}.source"))
        name = default_name(entry, d)
        if name in names:
            problems.append(Problem(f"{key}.name", name, f"data.sources[{names[name]}] has this name too; checkpoints keep each source's position by name", f"name one of them: {key}.name=<another name>"))
        names.setdefault(name, i)
    return problems


def stage_problems(cfg) -> list[Problem]:
    """data.stages: in order of until_step, within trainer.max_steps, each naming only the mixture's
    sources with weights that draw something."""
    d, max_steps = cfg.data, cfg.trainer.max_steps
    names = [default_name(entry, d) for entry in d.sources]
    problems, previous = [], 0
    for i, stage in enumerate(d.stages):
        key, until = f"data.stages[{i}]", stage.until_step
        if until is None and i < len(d.stages) - 1:
            problems.append(Problem(f"{key}.until_step", None, "null (to the end of the run) is for the last stage only", f"give it the step the next stage starts at: {key}.until_step=<step>"))
        elif until is not None and until > max_steps:
            problems.append(Problem(f"{key}.until_step", until, f"is beyond trainer.max_steps({max_steps})", f"use a step up to {max_steps}, null for the run's end, or raise trainer.max_steps"))
        elif until is not None and until <= previous:
            problems.append(Problem(f"{key}.until_step", until, f"stages go in order: it must be after the previous stage's end (step {previous})", "list the stages by until_step, each later than the one before"))
        previous = until if until is not None else previous
        unknown = sorted(set(stage.weights) - set(names))
        for name in unknown:
            problems.append(Problem(f"{key}.weights.{name}", stage.weights[name], f"names no mixture source (the sources are {', '.join(names)})", "use one of those names (data.sources[i].name, or the file name without its last suffix)"))
        bad = {n: w for n, w in stage.weights.items() if not (math.isfinite(w) and w >= 0)}
        for name, w in bad.items():
            problems.append(Problem(f"{key}.weights.{name}", w, "must be a finite number >= 0 (relative; 0 draws nothing from it)", "use e.g. 0.3"))
        if not unknown and not bad and not any(w > 0 for w in stage.weights.values()):
            problems.append(Problem(f"{key}.weights", dict(stage.weights), "draws from no source (every weight 0, or none given)", f"give at least one source a positive weight, e.g. {{{names[0]}: 1.0}}"))
    return problems

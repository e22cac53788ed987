"""The members of a weighted mixture (data.sources): each entry's name, weight and Source.

An entry's kind is its `source`, or else follows its path's suffix (data/shards.py's table: `.txt`
text, `.jsonl`/`.jsonl.zst`/`.json.gz` JSON Lines, `.parquet` Parquet); anything else (a folder, a
glob, a dataset name) data.source. Its text field is its own
`text_field` or data.text_field; the other reading options (text_split, hf_split, bad_records) are
data's. The name labels the source in the plan, the logs and the checkpoint's data position.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tinytrain.config.schema import DataSource
from tinytrain.data.shards import shard_format
from tinytrain.data.sources import Source


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

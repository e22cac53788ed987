"""A run's checkpoints in the plan: their format, and what they cost (disk, host memory, time).

format  `file` (single, ddp: one .ckpt), `deepspeed` (a folder of DeepSpeed's per-rank shards),
        `sharded` (fsdp_tp: a folder of DCP shards, one file per rank; checkpoint/sharded.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinytrain.config.schema import Strategy

FORMATS = {Strategy.single: "file", Strategy.ddp: "file", Strategy.deepspeed: "deepspeed", Strategy.fsdp_tp: "sharded"}


@dataclass(frozen=True)
class CheckpointPlan:
    format: str
    async_save: bool
    keep_last: int

    def to_dict(self) -> dict:
        return asdict(self)


def checkpoint_plan(cfg) -> CheckpointPlan:
    return CheckpointPlan(FORMATS[cfg.parallel.strategy], bool(cfg.checkpoint.async_save), cfg.checkpoint.keep_last)

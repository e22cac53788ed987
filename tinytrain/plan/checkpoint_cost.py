"""A run's checkpoints in the plan: their format, and what they cost (disk, host memory, time).

format  the strategy's (plan/parallel.py's CheckpointFormat): `file` (single, ddp: one .ckpt),
        `deepspeed` (a folder of DeepSpeed's per-rank shards), `sharded` (fsdp_tp: a folder of DCP
        shards, one file per rank; checkpoint/sharded.py).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinytrain.plan.parallel import strategy_row


@dataclass(frozen=True)
class CheckpointPlan:
    format: str
    async_save: bool
    keep_last: int

    def to_dict(self) -> dict:
        return asdict(self)


def checkpoint_plan(cfg) -> CheckpointPlan:
    return CheckpointPlan(strategy_row(cfg.parallel.strategy).checkpoint_format.value, bool(cfg.checkpoint.async_save), cfg.checkpoint.keep_last)

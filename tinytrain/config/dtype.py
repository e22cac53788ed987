"""One precision type: `Dtype` names a weight/compute dtype once and gives its torch dtype and
Lightning's precision name, so no stage translates through strings of its own.

Here (config/) rather than in plan/ so that checkpoint/ (an earlier stage: the export) can take it
too; plan/precision.py decides which one a run uses.
"""

from __future__ import annotations

import enum


class Dtype(str, enum.Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"

    @property
    def lightning(self) -> str:
        """Lightning's name for training in it: the Trainer's `precision`, plan.json's `precision.value`."""
        return LIGHTNING[self]

    @property
    def torch(self):
        """The torch dtype (torch imported on use: planning stays light)."""
        import torch

        return getattr(torch, TORCH_NAMES[self])

    @classmethod
    def from_lightning(cls, value: str) -> Dtype:
        """The dtype a Lightning precision's weights are meant to run in (a saved run's
        config_resolved.yaml holds Lightning's name); fp32 for anything else."""
        return FROM_LIGHTNING.get(str(value), cls.fp32)


LIGHTNING = {Dtype.bf16: "bf16-mixed", Dtype.fp16: "16-mixed", Dtype.fp32: "32-true"}
TORCH_NAMES = {Dtype.bf16: "bfloat16", Dtype.fp16: "float16", Dtype.fp32: "float32"}
FROM_LIGHTNING = {"bf16-mixed": Dtype.bf16, "bf16-true": Dtype.bf16, "16-mixed": Dtype.fp16, "16-true": Dtype.fp16, "32-true": Dtype.fp32, "32": Dtype.fp32}

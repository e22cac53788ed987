"""Loss-scale collapse: stop with the likely cause and the fixes instead of DeepSpeed's
"Current loss scale already at minimum" or a GradScaler quietly scaling toward zero."""

from __future__ import annotations

import logging

import lightning.pytorch as pl

from tinytrain.errors import TrainingStopped
from tinytrain.model.guard_report import current_loss_scale
from tinytrain.model.module import writes_metrics_row
from tinytrain.plan.precision import LossScalePolicy
from tinytrain.train.metrics_csv import write_step_row_now

log = logging.getLogger(__name__)


class LossScaleGuard(pl.Callback):
    def __init__(self, max_consecutive_halvings: int, policy: LossScalePolicy, untrained_rows: list, nonfinite_guard=None):
        self.max_halvings = max_consecutive_halvings
        self.floor = policy.min_scale
        self.untrained_rows = untrained_rows  # what preflight saw and was told not to fix
        self.nonfinite_guard = nonfinite_guard  # names the layer of the last overflow
        self.previous: float | None = None
        self.halvings = 0
        self.start: float | None = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        scale = current_loss_scale(trainer)
        if scale is None:
            return
        if self.start is None:
            self.start = scale
        halved = self.previous is not None and scale < self.previous
        self.halvings = self.halvings + 1 if halved else 0
        self.previous = scale
        # A halving onto the floor stops too: DeepSpeed raises "Current loss scale already at
        # minimum" on the next overflow, and GradScaler would go on below it.
        stopping = self.halvings >= self.max_halvings or scale < self.floor or (halved and scale <= self.floor)
        if stopping or writes_metrics_row(trainer):  # on the rows alone: each `log` costs 0.3-1 ms of bookkeeping
            pl_module.log("loss_scale", scale)
        if stopping:
            write_step_row_now(trainer, force=True, fresh={"loss_scale": scale})  # the stopping step's row
            self.stop(self.diagnosis(trainer.global_step, scale))

    def stop(self, message: str) -> None:
        raise TrainingStopped(message)

    def diagnosis(self, step: int, scale: float) -> str:
        what = f"{self.halvings} halvings in a row" if self.halvings >= self.max_halvings else f"down to the floor precision.loss_scale.min_scale={self.floor:g}"
        causes = []
        if self.untrained_rows:
            tokens = ", ".join(sorted({repr(r.token) for r in self.untrained_rows}))
            causes.append(f"untrained embedding rows that preflight found and was told not to fix: {tokens}")
        layer = getattr(self.nonfinite_guard, "last_bad_parameter", None)
        if layer:
            causes.append(f"gradient overflow first seen in {layer}")
        cause = "; ".join(causes) if causes else "gradients overflow fp16 at every scale tried"
        return (
            f"tinytrain: fp16 loss scale collapsed at step {step}: {self.start:g} -> {scale:g} ({what}). Likely cause: {cause}. "
            "Fix: model.untrained_tokens=mean (rewrites untrained rows), bf16 on a GPU with compute capability >= 8.0, "
            "a lower trainer.lr, or a gentler policy (precision.loss_scale.initial_scale_power / window / min_scale)."
        )

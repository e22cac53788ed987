"""Non-finite loss or gradient: name the first parameter (forward order) with a non-finite
gradient, the step and the loss scale; skip the step (up to N in a row) or stop.

Under fp16 dynamic loss scaling an overflowing step is the scaler's normal business (it skips the
step and halves the scale), so there the count of skips in a row is left to the loss-scale guard
(`guard.loss_scale_halvings`, callbacks/loss_scale_guard.py), which can name the cause.

`stop` saves the last good state first: the hook runs before the optimizer step, so the weights
are still those of the last finite step. Where the loss itself was non-finite, the message says so
and names the loss's own settings (a preference objective's finetune.beta ...): the first
parameter its gradient reaches is then a victim, not the cause.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import lightning.pytorch as pl
import torch

from tinytrain.errors import TrainingStopped
from tinytrain.model.guard_report import (
    ForwardOrder,
    current_loss_scale,
    deepspeed_engine,
    first_nonfinite_gradient,
    grad_scaler,
)
from tinytrain.train.metrics_csv import write_step_row_now

log = logging.getLogger(__name__)


class NonFiniteGuard(pl.Callback):
    def __init__(self, policy: str, max_consecutive_skips: int, checkpoint_dir: Path, loss_settings: str | None = None, compiled: bool = False):
        self.policy = policy  # "skip" | "stop"
        self.loss_settings = loss_settings  # e.g. "finetune.objective=dpo finetune.beta=0.1"
        self.loss: torch.Tensor | None = None  # this step's, read only once a gradient is non-finite (no sync)
        self.max_skips = max_consecutive_skips
        self.checkpoint_dir = checkpoint_dir
        self.order = ForwardOrder()
        # Compiled modules run their forward hooks inside the graph: dynamo would guard on each
        # module's name in the recording hook and compile every block anew until its recompile
        # limit (8), running the deeper blocks eagerly. Compiled runs name parameters in module
        # order, which differs from forward order only within a layer.
        self.compiled = compiled
        self.consecutive = 0
        self.last_bad_parameter: str | None = None
        self.streak_start = 0  # the first step of the current run of non-finite steps (counted from 1)

    def on_train_start(self, trainer, pl_module):
        if not self.compiled:
            self.order.attach(pl_module)

    def on_before_backward(self, trainer, pl_module, loss):
        self.loss = loss.detach()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.order.names is None:
            self.order.freeze(pl_module)

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        grads = [p.grad for p in pl_module.parameters() if p.grad is not None]
        if not grads:
            return
        sharded = any(hasattr(g, "to_local") for g in grads)
        local = [g.to_local() if hasattr(g, "to_local") else g for g in grads]
        total = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(local)))  # one fused pass
        if not sharded:
            # The module's clipping reuses this norm instead of a second pass over the gradients.
            pl_module.remember_grad_norm(total)
        if bool(torch.isfinite(total)):  # one sync
            self.consecutive = 0
            return
        if self.order.names is None:
            self.order.freeze(pl_module)
        name = first_nonfinite_gradient(pl_module, self.order.names)
        self.last_bad_parameter = name
        self.consecutive += 1
        if self.consecutive == 1:
            self.streak_start = trainer.global_step + 1
        scale = current_loss_scale(trainer)
        # Counted as the progress lines and checkpoint names count (the step being trained, from 1);
        # its metrics.csv row is Lightning's step - 1.
        where = f"step {trainer.global_step + 1}: first non-finite gradient ({'module' if self.compiled else 'forward'} order) in {name}"
        scale_text = f", loss scale {scale:g}" if scale is not None else ""
        scaling = scale is not None
        # Under fp16 loss scaling an overflow of the scaled gradients with a finite loss is the
        # scaler's to skip (guard.nonfinite=stop stopped a healthy run at the first one); a
        # non-finite loss is not.
        overflow = scaling and self.loss is not None and bool(torch.isfinite(self.loss).all())
        if (self.policy == "stop" and not overflow) or (self.consecutive > self.max_skips and not scaling):
            path = self.checkpoint_dir / "last_good.ckpt"
            write_step_row_now(trainer, force=True, fresh={"grad_norm": float(total)})  # the stopping step's row, its norm included
            trainer.save_checkpoint(path)
            why = "guard.nonfinite=stop" if self.policy == "stop" else f"{self.consecutive} consecutive non-finite steps (guard.max_consecutive_skips={self.max_skips})"
            raise TrainingStopped(f"tinytrain: training stopped at {where}{scale_text} ({why}). The last good weights are in {path}. Fix: {self.fix()}")
        log.warning("non-finite gradient at %s%s: step skipped (%d in a row)%s", where, scale_text, self.consecutive, "; the loss scale halves" if scaling else "")
        if grad_scaler(trainer) is None and deepspeed_engine(trainer) is None:
            # Without a GradScaler or DeepSpeed (whose optimizer checks for overflow itself)
            # nothing else skips it: no gradients, no update for any parameter.
            for p in pl_module.parameters():
                p.grad = None

    def unusable_end(self, val_loss: float | None, last_loss: float | None, step: int) -> str | None:
        """Why the weights a run ended on are not worth exporting, or None. The skip policy lets a
        run go on past up to max_consecutive_skips non-finite steps; one whose last steps were
        skipped because the weights themselves had gone bad ends there, its validation (or, with
        none, its last training) loss non-finite."""
        name, loss = ("validation", val_loss) if val_loss is not None else ("training", last_loss)
        if loss is None or math.isfinite(loss):
            return None
        first = self.streak_start
        if self.consecutive:
            skipped = f"; steps {first}-{step} were skipped as non-finite (guard.max_consecutive_skips={self.max_skips} lets a run go on through that many in a row)"
        else:
            skipped = ""
        if self.consecutive and first > 1:
            good = f"the weights went bad in or before the update of step {first - 1}: resume from a step checkpoint older than that, where one is kept"
        elif self.consecutive:
            good = "the very first step was non-finite: check the initial weights (checkpoint.init_from) and the data"
        else:
            good = "an older step checkpoint, where one is kept, may hold good weights"
        return (
            f"tinytrain: training ended at step {step} on weights whose {name} loss is {loss:g}{skipped}. They are not usable, so nothing was exported; "
            f"checkpoints/final.ckpt keeps them for inspection, and {good}. "
            f"Fix: {self.USUAL_FIX} guard.nonfinite=stop stops at the first non-finite step, saving checkpoints/last_good.ckpt."
        )

    USUAL_FIX = "lower trainer.lr, keep trainer.grad_clip on, check the data of this step, or train in bf16/fp32; in fp16 also see the loss-scale policy (precision.loss_scale.*)."

    def fix(self) -> str:
        usual = self.USUAL_FIX
        if self.loss is None or bool(torch.isfinite(self.loss).all()):
            return usual
        if self.loss_settings:
            return f"the loss itself is {float(self.loss):g}, before any gradient: check its settings ({self.loss_settings}); then {usual}"
        return f"the loss itself is {float(self.loss):g}, before any gradient: check the data of this step; then {usual}"

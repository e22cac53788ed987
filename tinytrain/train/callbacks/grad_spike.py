"""Gradient-norm spikes relative to a running average, logged as events (the run goes on). The
average is kept in checkpoints; a resumed run drops the events of steps after its checkpoint."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import lightning.pytorch as pl

from tinytrain.train.jsonl_rows import drop_after

log = logging.getLogger(__name__)


class GradSpikeMonitor(pl.Callback):
    def __init__(self, factor: float, warmup_steps: int, events_file: Path, beta: float = 0.9):
        self.factor = factor
        self.warmup = warmup_steps
        self.events_file = events_file
        self.beta = beta
        self.average: float | None = None
        self.seen = 0
        self.events: list[dict] = []
        self._last_step = -1

    def state_dict(self) -> dict:
        # A resumed run goes on with the running average (its warm-up unchecked again, otherwise).
        return {"average": self.average, "seen": self.seen}

    def load_state_dict(self, state: dict) -> None:
        self.average, self.seen = state["average"], int(state["seen"])

    def on_train_start(self, trainer, pl_module):
        if trainer.is_global_zero and trainer.global_step:  # a resumed run: its later events come again
            drop_after(self.events_file, trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        norm = getattr(pl_module, "step_values", {}).get("grad_norm")  # every step's (the loggers get some)
        if norm is None or trainer.global_step == self._last_step:  # no new optimizer step
            return
        self._last_step = trainer.global_step
        norm = float(norm)
        if not math.isfinite(norm):
            return  # the non-finite guard reports these
        self.seen += 1
        if self.average is not None and self.seen > self.warmup and norm > self.factor * self.average:
            event = {"step": trainer.global_step, "grad_norm": norm, "running_average": self.average, "ratio": norm / self.average}
            self.events.append(event)
            log.warning("grad-norm spike at step %d: %.3g is %.1fx the running average %.3g", event["step"], norm, event["ratio"], self.average)
            if trainer.is_global_zero:
                with self.events_file.open("a") as f:
                    f.write(json.dumps(event) + "\n")
        self.average = norm if self.average is None else self.beta * self.average + (1 - self.beta) * norm

"""Training tokens seen by a step, across resumes under another batch size.

The plan counts steps at the run's global batch (plan/layout.py tokens_over, a batch warm-up's
smaller steps as they are); a run resumed under another batch trained its earlier steps at the old
one, so evals.csv's `tokens` (and evals.png's axis) went up by the new batch from step 0. Each
checkpoint records the tokens seen by its step; a resumed run counts on from there.
"""

from __future__ import annotations

from collections.abc import Callable

import lightning.pytorch as pl

STATE_KEY = "TokensSeen"  # Lightning's key for this callback's state in a checkpoint's "callbacks"


class TokensSeen(pl.Callback):
    def __init__(self, tokens_over: Callable[[int], int]):
        self.tokens_over = tokens_over  # this run's count of its first n steps
        self.base = (0, 0)  # (step, tokens seen by it) of the checkpoint resumed from, or the start
        self._trainer = None

    @property
    def state_key(self) -> str:
        return STATE_KEY

    def setup(self, trainer, pl_module, stage):
        self._trainer = trainer

    def at(self, step: int) -> int:
        """Tokens seen by the end of optimizer step `step` (this run's batch from the resumed step on)."""
        base_step, base_tokens = self.base
        return base_tokens + self.tokens_over(step) - self.tokens_over(base_step)

    def state_dict(self) -> dict:
        step = self._trainer.global_step if self._trainer is not None else self.base[0]
        return {"step": step, "tokens": self.at(step)}

    def load_state_dict(self, state: dict) -> None:
        self.base = (int(state["step"]), int(state["tokens"]))

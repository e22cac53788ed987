"""The learning-rate schedule: a pure function of the optimizer step and the trainer settings.

  cosine    linear warm-up to trainer.lr, cosine decay to min_lr_ratio x lr at the last step
  linear    linear warm-up, linear decay to min_lr_ratio x lr at the last step
  constant  linear warm-up, then trainer.lr to the end
  wsd       warmup-stable-decay (MiniCPM, SmolLM, OLMo 2): linear warm-up, trainer.lr held, and a
            decay over the last decay_steps (or decay_fraction x max_steps) steps, shaped
            linear, cosine or 1-sqrt (1 - sqrt(progress), DeepSeek's and "Scaling Laws and
            Compute-Optimal Training Beyond Fixed Training Durations")

With trainer.batch_size_warmup the schedule is kept in tokens: its steps are steps of the final
batch, and optimizer step k reads it at the tokens trained before it (data/batch_ramp.py
`equivalent_step`), so the ramp's smaller steps advance the warm-up and decay by what they train.

Because the rate depends only on the step and these settings (never on the scheduler's saved
state), a run continued from a stable-phase checkpoint with a later max_steps and a decay
(a new trainer.stage) trains step for step as a run given that schedule from the start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tinytrain.config.schema import DecayShape, LrSchedule
from tinytrain.data.batch_ramp import BatchRamp
from tinytrain.errors import Problem


def warmup_cosine(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """LR multiplier: linear warm-up to 1, cosine decay to min_ratio at the last step (`total` - 1)."""
    return Schedule(LrSchedule.cosine, warmup, total, total - warmup, DecayShape.cosine, min_ratio).multiplier(step)


SHAPES = {
    DecayShape.linear: lambda p: 1.0 - p,
    DecayShape.cosine: lambda p: 0.5 * (1.0 + math.cos(math.pi * p)),
    DecayShape.one_minus_sqrt: lambda p: 1.0 - math.sqrt(p),
}


@dataclass(frozen=True)
class Schedule:
    kind: LrSchedule
    warmup: int
    total: float  # trainer.max_steps; with a batch ramp, the run's tokens in steps of the final batch
    decay_steps: float  # steps of the decay at the end (cosine/linear: everything after the warm-up; constant: 0)
    shape: DecayShape
    min_ratio: float
    ramp: BatchRamp | None = None  # trainer.batch_size_warmup: optimizer steps read the schedule at their tokens

    @property
    def decay_start(self) -> int:
        return self.total - self.decay_steps

    def position(self, step: int) -> float:
        """Where optimizer step `step` reads the schedule: the step itself, or with a batch ramp the
        steps of the final batch trained before it."""
        return step if self.ramp is None else self.ramp.equivalent_step(step)

    def multiplier(self, step: int) -> float:
        """lr / trainer.lr at optimizer step `step` (0-based: the first step trains with step 0's)."""
        step = self.position(step)
        if step < self.warmup:
            return min(1.0, (step + 1) / self.warmup)  # a ramp's fractional steps stop at the peak
        if self.decay_steps == 0 or step < self.decay_start:
            return 1.0
        # Like the warm-up, counted so its last step is trained: step decay_start + k trains at
        # progress (k + 1) / decay_steps, so the run's last step (total - 1) trains at min_ratio
        # (a decay of one step is that step, not a decay that ends at the untrained step `total`).
        progress = min(1.0, (step - self.decay_start + 1) / self.decay_steps)
        return self.min_ratio + (1.0 - self.min_ratio) * SHAPES[self.shape](progress)

    def phases(self) -> list[tuple[str, int, int]]:
        """(name, first step, end step) of each phase with steps in it."""
        named = [("warmup", 0, self.warmup), ("stable", self.warmup, self.decay_start), (f"decay ({self.shape.value})", max(self.warmup, self.decay_start), self.total)]
        return [(n, a, b) for n, a, b in named if b > a]

    def to_dict(self) -> dict:
        return {
            "kind": self.kind.value,
            "warmup_steps": self.warmup,
            "decay_steps": round(self.decay_steps, 3),
            "decay_start": round(self.decay_start, 3),
            "total_steps": round(self.total, 3),  # the schedule's length in its own steps
            "counted_in": "steps" if self.ramp is None else "tokens, in steps of the final batch (trainer.batch_size_warmup)",
            "decay_shape": self.shape.value,
            "min_lr_ratio": self.min_ratio,
            "phases": [{"phase": n, "from_step": a, "to_step": b} for n, a, b in self.phases()],
        }


def decay_steps(t, total: float | None = None) -> float:
    """The decay's length in steps for trainer settings `t` (validated: within the run); `total`:
    the run's length in steps of the final batch where a batch ramp makes it other than max_steps."""
    total = t.max_steps if total is None else total
    if t.lr_schedule == LrSchedule.constant:
        return 0
    if t.lr_schedule in (LrSchedule.cosine, LrSchedule.linear):
        return total - t.warmup_steps
    return t.decay_steps if t.decay_steps is not None else round(t.decay_fraction * total)


def from_trainer(t, ramp: BatchRamp | None = None) -> Schedule:
    shape = {LrSchedule.cosine: DecayShape.cosine, LrSchedule.linear: DecayShape.linear}.get(t.lr_schedule, t.decay_shape)
    if ramp is None:
        return Schedule(t.lr_schedule, t.warmup_steps, t.max_steps, decay_steps(t), shape, t.min_lr_ratio)
    total = ramp.equivalent_step(t.max_steps)
    return Schedule(t.lr_schedule, t.warmup_steps, total, decay_steps(t, total), shape, t.min_lr_ratio, ramp)


def picture(schedule: dict, total: int, *, width: int = 60, height: int = 6, marks: dict[float, str] | None = None) -> list[str]:
    """A small text plot of the schedule (plan.json's `schedule`), lr against step; `marks`:
    positions to label under the axis (a stage's start). With a batch ramp the axis is the
    schedule's own, steps of the final batch (`total_steps`), not the run's optimizer steps."""
    in_tokens = schedule.get("counted_in", "steps") != "steps"
    total = schedule.get("total_steps", total)
    s = Schedule(LrSchedule(schedule["kind"]), schedule["warmup_steps"], total, schedule["decay_steps"], DecayShape(schedule["decay_shape"]), schedule["min_lr_ratio"])
    width = max(1, min(width, math.ceil(total)))

    def column_position(i: int) -> float:
        x = i * (total - 1) / max(1, width - 1)
        return x if in_tokens else min(total - 1, round(x))

    columns = [s.multiplier(column_position(i)) for i in range(width)]
    # A filled area: row r (of `height`) is marked where the multiplier reaches it.
    rows = ["".join("#" if v * height >= r - 0.5 else " " for v in columns) for r in range(height, 0, -1)]
    axis = ["-"] * width
    for step, label in (marks or {}).items():
        at = min(width - 1, round(step * (width - 1) / max(1, total - 1)))
        axis[at] = label
    lines = [f"  1.0 |{rows[0]}"] + [f"      |{row}" for row in rows[1:]]
    lines.append(f"  0.0 +{''.join(axis)}")
    end = f"{total:g}"
    lines.append(f"       step 0{' ' * max(1, width - len(end) - 6)}{end}" + (" (steps of the final batch: the schedule counts tokens)" if in_tokens else ""))
    return lines


def schedule_problems(t, total: float | None = None) -> list[Problem]:
    """A WSD decay must fit in the run after the warm-up (tinytrain/plan/schedule.py). `total`: the
    run's length in steps of the final batch under a batch ramp (plan/layout.py `with_ramp` checks
    that case, once the ramp is known), which is shorter than trainer.max_steps."""
    if t.lr_schedule != LrSchedule.wsd:
        if t.decay_steps is not None:
            return [Problem("trainer.decay_steps", t.decay_steps, f"only trainer.lr_schedule=wsd has a decay of its own length ({'constant holds its rate after the warm-up' if t.lr_schedule == LrSchedule.constant else f'{t.lr_schedule.name} decays over the whole run after the warm-up'})", "set trainer.lr_schedule=wsd, or trainer.decay_steps=null")]
        return []
    if t.decay_steps is None and not 0.0 < t.decay_fraction <= 1.0:
        return [Problem("trainer.decay_fraction", t.decay_fraction, "must be in (0, 1]: the share of trainer.max_steps the decay takes", "use e.g. trainer.decay_fraction=0.2 (the last 20% of the run)")]
    key, value = ("trainer.decay_steps", t.decay_steps) if t.decay_steps is not None else ("trainer.decay_fraction", t.decay_fraction)
    steps = decay_steps(t, total)
    if total is None:
        room, length = t.max_steps - max(0, t.warmup_steps), f"trainer.max_steps({t.max_steps})"
    else:
        room = math.floor(total - max(0, t.warmup_steps))
        length = f"the run's tokens in steps of the final batch ({total:g} of trainer.max_steps={t.max_steps}: the schedule counts tokens under trainer.batch_size_warmup)"
    if steps < 1 or steps > room:
        return [
            Problem(
                key,
                value,
                f"a decay of {steps:g} steps does not fit in the run: {length} - trainer.warmup_steps({t.warmup_steps}) = {room} steps after the warm-up",
                f"use a decay of 1 to {room} steps (trainer.decay_steps=<n>, or a trainer.decay_fraction {'larger' if steps < 1 else 'smaller'} than {t.decay_fraction:g}), or raise trainer.max_steps to continue the run into a longer decay",
            )
        ]
    return []

"""trainer.profile: a torch profiler trace of a window of optimizer steps, and a CUDA memory
snapshot when the run dies of an out-of-memory error, both in <run dir>/profile/.

The window is this process's steps profile_start .. profile_start + profile_steps - 1, counted from
where it starts (a resumed run too), after one step of profiler warm-up; the first steps compile
and allocate, so the default window starts at step 3. Each rank writes
`rank<r>.<time>.pt.trace.json` (TensorBoard's profiler plugin and ui.perfetto.dev open it) and
`top_ops_rank<r>.txt`; the end-of-run summary names the top costs. On a CUDA GPU the allocator's
history is recorded from the first step, so an out-of-memory error leaves
`memory_snapshot_rank<r>.pickle` (drag it onto pytorch.org/memory_viz) beside
`memory_estimate_rank<r>.json`: the plan's per-GPU estimate and what the allocator held.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import lightning.pytorch as pl

log = logging.getLogger(__name__)

TOP = 5  # costs named in the summary
HISTORY_ENTRIES = 100_000  # allocator events kept for the out-of-memory snapshot


class Profiler(pl.Callback):
    def __init__(self, folder: Path, *, start: int, steps: int, memory_estimate: dict):
        self.folder = folder
        self.start, self.steps = start, steps
        self.memory_estimate = memory_estimate
        self.profiler = None
        self.top: list[tuple[str, float, float]] = []  # (op, self time in ms, share of the window)
        self._last_step: int | None = None
        self._rank = 0

    @property
    def warmup(self) -> int:
        """Steps the profiler warms up for before its window: one, where the window leaves room."""
        return 1 if self.start > 0 else 0

    def traces(self, step: int) -> bool:
        """Whether this process's `step`-th optimizer step (from 0) is slowed by the profiler: its
        warm-up step and its window, which run traced, and the step after, in whose measured time
        (callbacks before this one measure it) the trace and its table are written.
        ThroughputMonitor leaves them out."""
        return self.start - self.warmup <= step <= self.start + self.steps

    def on_train_start(self, trainer, pl_module):
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule

        self._rank = trainer.global_rank
        self._last_step = trainer.global_step
        self.folder.mkdir(parents=True, exist_ok=True)
        cuda = torch.cuda.is_available()
        if cuda:
            torch.cuda.memory._record_memory_history(max_entries=HISTORY_ENTRIES)
        activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
        self.profiler = profile(activities=activities, schedule=schedule(wait=self.start - self.warmup, warmup=self.warmup, active=self.steps, repeat=1), on_trace_ready=self.ready, profile_memory=True)
        self.profiler.start()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.profiler is None or trainer.global_step == self._last_step:  # inside gradient accumulation
            return
        self._last_step = trainer.global_step
        self.profiler.step()

    def ready(self, prof) -> None:
        """The window is done: its trace, the table of ops and the top costs."""
        import torch

        prof.export_chrome_trace(str(self.folder / f"rank{self._rank}.{prof.step_num}.pt.trace.json"))
        key = "self_device_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=key, row_limit=25)
        (self.folder / f"top_ops_rank{self._rank}.txt").write_text(table + "\n")
        events = [e for e in prof.key_averages() if not e.key.startswith("ProfilerStep")]
        total = sum(getattr(e, key) for e in events) or 1.0
        ranked = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:TOP]
        self.top = [(e.key, getattr(e, key) / 1000.0, getattr(e, key) / total) for e in ranked]

    def on_train_end(self, trainer, pl_module):
        self.stop()

    def on_exception(self, trainer, pl_module, exception):
        import torch

        if isinstance(exception, torch.OutOfMemoryError) and torch.cuda.is_available():
            self.memory_snapshot()
        self.stop()

    def memory_snapshot(self) -> None:
        import torch

        self.folder.mkdir(parents=True, exist_ok=True)
        snapshot = self.folder / f"memory_snapshot_rank{self._rank}.pickle"
        torch.cuda.memory._dump_snapshot(str(snapshot))
        measured = {"max_allocated_gib": torch.cuda.max_memory_allocated() / 2**30, "reserved_gib": torch.cuda.memory_reserved() / 2**30}
        (self.folder / f"memory_estimate_rank{self._rank}.json").write_text(json.dumps({"plan": self.memory_estimate, "measured": measured}, indent=2) + "\n")
        log.error("CUDA out of memory: the allocator's history is in %s (pytorch.org/memory_viz), beside the plan's estimate of %.1f GiB per GPU (memory_estimate_rank%d.json)", snapshot, self.memory_estimate["total_gib"], self._rank)

    def stop(self) -> None:
        if self.profiler is None:
            return
        import torch

        profiler, self.profiler = self.profiler, None
        profiler.stop()
        if torch.cuda.is_available():
            torch.cuda.memory._record_memory_history(enabled=None)

    def summary(self) -> str | None:
        if not self.top:
            return None
        costs = "; ".join(f"{name} {ms:.1f} ms ({100 * share:.0f}%)" for name, ms, share in self.top)
        return f"profile of steps {self.start}-{self.start + self.steps - 1} in {self.folder}: top costs by self time, as shares of all ops' self time ({self.folder.name}/top_ops_rank{self._rank}.txt's % also counts its ProfilerStep rows) {costs}"

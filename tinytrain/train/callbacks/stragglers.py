"""Measures each rank's forward time per micro batch and, every N optimizer steps, compares the
ranks (cluster/stragglers.py decides): a rank consistently slower than the others is named in the
log, in the metrics (straggler/rank, straggler/slowdown: the slowest rank and by how much, at every
check, in a row of their own) and in the end-of-run summary. On a GPU the times are CUDA events read at the check, so
measuring never waits for the device; on a CPU, the main thread's CPU time."""

from __future__ import annotations

import logging
import socket
import statistics
import time

import lightning.pytorch as pl

from tinytrain.cluster.stragglers import StragglerRecord, slowdowns, typical_forward

log = logging.getLogger(__name__)


class Stragglers(pl.Callback):
    def __init__(self, every_n_steps: int, threshold: float):
        self.every = every_n_steps
        self.record = StragglerRecord(threshold)
        self.pending: list = []  # this window's (start, end) pairs: CUDA events, or thread CPU times
        self.start = None
        self.step_seen = 0

    def _mark(self, pl_module):
        if pl_module.device.type == "cuda":
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        # On a CPU, the thread's CPU time: a rank sharing its cores with other processes waits for
        # them, which is noise here, not the rank's own slowness (a throttled core still shows).
        return time.thread_time()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.start = self._mark(pl_module)

    def on_before_backward(self, trainer, pl_module, loss):
        if self.start is not None:
            self.pending.append((self.start, self._mark(pl_module)))
            self.start = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step_seen or trainer.world_size < 2:
            return  # inside gradient accumulation, or nothing to compare
        self.step_seen = trainer.global_step
        if trainer.global_step % self.every or not self.pending:
            return
        import torch

        if not isinstance(self.pending[-1][1], float):
            self.pending[-1][1].synchronize()  # long done: the backward and the optimizer step ran after it
        times = [b - a if isinstance(a, float) else a.elapsed_time(b) / 1e3 for a, b in self.pending]
        self.pending = []
        mine = torch.tensor([typical_forward(times)], dtype=torch.float64, device=pl_module.device)
        every = trainer.strategy.all_gather(mine).flatten().tolist()
        named = self.record.check(every)
        slow = slowdowns(every)
        worst = max(range(len(slow)), key=slow.__getitem__)
        # To the loggers directly, as a row of this step: a value given to self.log stays in
        # Lightning's results until the epoch ends and would repeat in every step's row after it.
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics({"straggler/rank": float(worst), "straggler/slowdown": slow[worst]}, step=trainer.global_step - 1)
            for rank, s in named:
                log.warning("straggler: rank %d is %.0f%% slower than the other ranks' median in forward compute (%.1f ms vs %.1f ms per micro batch) at step %d, %d checks running",
                            rank, 100 * s, 1e3 * every[rank], 1e3 * statistics.median(every[:rank] + every[rank + 1 :]), trainer.global_step, self.record.streak[rank])
        if named and any(r == trainer.global_rank for r, _ in named):
            log.warning("straggler: this rank (host %s) is the slow one", socket.gethostname())

    def summary(self) -> str:
        return self.record.summary()

"""The DataLoader the run trains and validates with: its workers start with the stop signals held.

A loader without persistent workers starts fresh ones for every iterator (each validation, each
epoch). Between a worker's fork and its worker_init_fn (orphan_guard.leave_stop_signals_to) the
group's SIGTERM from scancel or a time limit still had its default action: the worker died, and
torch raised "DataLoader worker exited unexpectedly" in the trainer (exit 1, no checkpoint).
"""

from __future__ import annotations

from torch.utils.data import DataLoader

from tinytrain.data.orphan_guard import stop_signals_held


class WorkerSafeDataLoader(DataLoader):
    def __iter__(self):
        if not self.num_workers:
            return super().__iter__()
        with stop_signals_held():  # the workers start inside
            return super().__iter__()

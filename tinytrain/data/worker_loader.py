"""The DataLoader the run trains and validates with: its workers start with the stop signals held.

A loader without persistent workers starts fresh ones for every iterator (each validation, each
epoch). Between a worker's fork and its worker_init_fn (orphan_guard.leave_stop_signals_to) the
group's SIGTERM from scancel or a time limit still had its default action: the worker died, and
torch raised "DataLoader worker exited unexpectedly" in the trainer (exit 1, no checkpoint).
"""

from __future__ import annotations

import functools
import os

from torch.utils.data import DataLoader

from tinytrain.data.orphan_guard import dataloader_worker_init, stop_signals_held


class WorkerSafeDataLoader(DataLoader):
    """Its workers run orphan_guard's init first (they end with this process, and leave the
    group's stop signals to it): without it they would keep those signals blocked for life."""

    def __init__(self, *args, num_workers: int = 0, worker_init_fn=None, **kwargs):
        guard = functools.partial(dataloader_worker_init, os.getpid())
        init = guard if worker_init_fn is None else functools.partial(_both, guard, worker_init_fn)
        super().__init__(*args, num_workers=num_workers, worker_init_fn=init if num_workers else worker_init_fn, **kwargs)

    def __iter__(self):
        if not self.num_workers:
            return super().__iter__()
        with stop_signals_held():  # the workers start inside
            return super().__iter__()


def _both(first, then, worker_id: int) -> None:
    first(worker_id)
    then(worker_id)

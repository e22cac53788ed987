"""Python's cyclic garbage collector paused while tinytrain imports its stack (torch, Lightning,
transformers, DeepSpeed): imports build ~600k long-lived objects and almost no cyclic garbage, yet
the collector ran ~1,100 times as they loaded, 5.59 -> 4.82 s of a start on a CPU here
(`python benchmarks/import_gc.py`). What the imports built is then frozen out of the collector's
reach (gc.freeze), so the run's own full collections walk only what the run allocates."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def release_finished_job() -> None:
    """The end of a multirun job, with another to follow in this process: what it built (its model,
    optimizer state, data maps, watchdog process) is garbage now, but its later imports' freeze had
    moved much of it out of the collector's reach, and every job kept its predecessors' (+40 MB and
    +9 open files a job on a tiny model). Thawed and collected once here; the next job freezes again."""
    gc.unfreeze()
    gc.collect()


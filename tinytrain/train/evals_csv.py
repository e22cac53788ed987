"""evals.csv: one row per (step, task, metric) of the downstream tasks (eval.tasks), written by the
inline evaluation and by mode=eval's backfill.

Each scoring's rows are appended at once: the file is rewritten beside itself and renamed over the
old one (checkpoint/files.py's temp name), so a process killed midway leaves a file without that
step, never half of it, and the step is scored again by whoever comes next. A resumed run drops
the rows of the steps after its checkpoint (trained again, then scored again), as metrics.csv does.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from tinytrain.checkpoint.files import replace_csv

COLUMNS = ("step", "tokens", "task", "metric", "value", "stderr")


def rows_of(results: dict, step: int, tokens: int) -> list[dict]:
    """lm-eval's results ({task: {"acc,none": v, "acc_stderr,none": s, ...}}) as rows; a metric
    under a filter other than lm-eval's `none` is named metric/filter."""
    rows = []
    for task, metrics in sorted(results.items()):
        for key, value in sorted(metrics.items()):
            if "," not in key or "_stderr," in key or not isinstance(value, int | float) or isinstance(value, bool):
                continue
            metric, filt = key.split(",", 1)
            stderr = metrics.get(f"{metric}_stderr,{filt}")
            stderr = float(stderr) if isinstance(stderr, int | float) and math.isfinite(stderr) else ""
            rows.append({"step": step, "tokens": tokens, "task": task, "metric": metric if filt == "none" else f"{metric}/{filt}", "value": float(value), "stderr": stderr})
    return rows


def read(path: Path) -> list[dict]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def scored_steps(path: Path) -> set[int]:
    return {int(r["step"]) for r in read(path)}


def scored_tasks(path: Path) -> dict[int, set[str]]:
    """step -> the tasks with rows at that step."""
    found: dict[int, set[str]] = {}
    for r in read(path):
        found.setdefault(int(r["step"]), set()).add(r["task"])
    return found


def append(path: Path, rows: list[dict]) -> None:
    """Add one scoring's rows, replacing those of the same step and task (a step trained again after
    a resume, or rescored); the step's other tasks stay."""
    keys = {(int(r["step"]), r["task"]) for r in rows}
    rewrite(path, lambda kept: [r for r in kept if (int(r["step"]), r["task"]) not in keys] + rows)


def drop_after(path: Path, step: int) -> int:
    """A resumed run's start: the rows of steps after the one it resumes from go (those weights are
    trained again, and scored again when reached), as metrics.csv's rows do. Returns how many went."""
    later = [r for r in read(path) if int(r["step"]) > step]
    if later:
        rewrite(path, lambda rows: [r for r in rows if int(r["step"]) <= step])
    return len(later)


def rewrite(path: Path, change) -> None:
    """evals.csv as change(its rows), written beside it and renamed over it."""
    from filelock import FileLock

    with FileLock(str(path) + ".lock"):  # eval.where=slurm: jobs of several checkpoints append at once
        rows = change(read(path))
        replace_csv(path, COLUMNS, sorted(rows, key=lambda r: (int(r["step"]), r["task"], r["metric"])))

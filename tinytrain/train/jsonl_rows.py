"""The run's JSON Lines records of steps (samples.jsonl, grad_spikes.jsonl) on a resume: the rows of
steps after the checkpoint it resumes from go, as metrics.csv's and evals.csv's do (those steps are
trained again and write their rows again; a kill and resume left them twice)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tinytrain.checkpoint.files import fsync_directory, temp_path


def drop_after(path: Path, step: int) -> tuple[list[dict], int]:
    """(the rows kept, how many went); the file rewritten beside itself and renamed over it."""
    if not path.exists():
        return [], 0
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = [json.loads(line) for line in lines]
    kept = [(line, row) for line, row in zip(lines, rows) if int(row.get("step", 0)) <= step]
    if len(kept) < len(rows):
        tmp = temp_path(path)
        with tmp.open("w", encoding="utf-8") as f:
            f.writelines(line + "\n" for line, _ in kept)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_directory(path.parent)
    return [row for _, row in kept], len(rows) - len(kept)

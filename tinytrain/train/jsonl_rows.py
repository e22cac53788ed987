"""The run's JSON Lines records of steps (samples.jsonl, grad_spikes.jsonl) on a resume: the rows of
steps after the checkpoint it resumes from go, as metrics.csv's and evals.csv's do (those steps are
trained again and write their rows again; a kill and resume left them twice)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tinytrain.checkpoint.files import replace_text

log = logging.getLogger(__name__)


def drop_after(path: Path, step: int) -> int:
    """How many rows went; the file rewritten beside itself and renamed over it. A line
    that is not JSON (the last one cut where a full disk or a kill stopped its write) goes too, with
    a warning: a record file never stops a resume."""
    if not path.exists():
        return 0
    text = path.read_text(encoding="utf-8", errors="replace")
    lines, rows, broken = [], [], 0
    for line in text.split("\n"):  # not splitlines(): a completion may hold U+2028 or U+0085 unescaped
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            broken += 1
            continue
        lines.append(line)
        rows.append(row)
    if broken:
        log.warning("%s: %d line(s) that are not JSON dropped (cut short by a full disk or a kill while written)", path, broken)
    kept = [(line, row) for line, row in zip(lines, rows) if int(row.get("step", 0)) <= step]
    if len(kept) < len(rows) or broken:
        replace_text(path, lambda f: f.writelines(line + "\n" for line, _ in kept))
    return len(rows) - len(kept)

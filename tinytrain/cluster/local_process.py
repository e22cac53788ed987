"""A process on this machine, named by its pid in a file another process wrote (a lock holder, a
temp file's writer, a build marker): whether it still runs, and since when."""

from __future__ import annotations

import os
from pathlib import Path


def running(pid: int) -> bool:
    """Whether a process with this pid exists here (another user's counts: signal 0 is refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def started_at(pid: int) -> float | None:
    """When a process started (epoch seconds, from /proc); None where that cannot be read."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")

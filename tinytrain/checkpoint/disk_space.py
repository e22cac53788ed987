"""A full disk, told apart from other write errors, and the free space named in the message.

Writers report it in their own words: an OSError (ENOSPC), safetensors' SafetensorError ("No space
left on device"), DCP's CheckpointException holding each failed rank's error.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path


def out_of_space(error: BaseException) -> bool:
    """Whether `error`, its causes or (DCP) its ranks' failures say the disk is full."""
    seen, todo = set(), [error]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if (isinstance(e, OSError) and e.errno == errno.ENOSPC) or "No space left on device" in str(e):
            return True
        todo += [e.__cause__, e.__context__, *(f[0] if isinstance(f, tuple) else f for f in getattr(e, "failures", {}).values())]
    return False


def free_space(folder: Path) -> str:
    """`1.2 MiB free of 64.0 MiB` on the disk holding `folder` (its nearest existing parent)."""
    usage = shutil.disk_usage(nearest_existing(folder))
    return f"{size(usage.free)} free of {size(usage.total)}"


def nearest_existing(path: Path) -> Path:
    """`path`, or where it does not exist yet its nearest existing parent: the disk it will be on."""
    path = Path(path).absolute()
    return next((p for p in (path, *path.parents) if p.exists()), Path("/"))


def size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024:
            return f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"

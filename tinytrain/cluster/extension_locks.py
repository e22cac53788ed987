"""Stale extension-build locks: torch builds a JIT op (DeepSpeed's cpu_adam, shm comm, ...) under a
`lock` file in its build folder (torch.utils.file_baton.FileBaton) and every other process waits,
silently and for ever, while that file exists. A build killed midway (preempted, timed out) leaves
it behind. The builder holds the file open from the moment it creates it until it removes it, so
a lock that no process on this host has open, in a folder nothing has written to for a while, has
lost its builder: it is removed before training starts, with a line saying so.

On a network file system (a shared home) the builder may be on another host, where its open file
cannot be seen: there the lock is removed only once its folder has been idle for
SHARED_IDLE_S, and otherwise named with the fix.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

LOCAL_IDLE_S = 30.0  # a builder between creating the lock and opening it is a few microseconds; this covers its release too
SHARED_IDLE_S = 600.0  # no file written in the build folder for this long: no compiler is running there
NETWORK_FILE_SYSTEMS = ("nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "fuse.sshfs", "ceph", "fuse.ceph", "panfs", "weka")


def extensions_root(env=os.environ) -> Path:
    """Where torch builds ops: TORCH_EXTENSIONS_DIR, else its default cache (one folder per Python and accelerator under it)."""
    if env.get("TORCH_EXTENSIONS_DIR"):
        return Path(env["TORCH_EXTENSIONS_DIR"])
    from torch.utils.cpp_extension import get_default_build_root

    return Path(get_default_build_root())


def holders(path: Path) -> list[int]:
    """Pids on this host with `path` open (from /proc)."""
    target = os.path.realpath(path)
    found = []
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) == target for fd in fd_dir.iterdir()):
                found.append(int(fd_dir.parent.name))
        except OSError:
            continue  # exited, or not ours to read
    return found


def idle_seconds(folder: Path, now: float) -> float:
    """Seconds since anything in the build folder was written."""
    newest = max((p.stat().st_mtime for p in folder.rglob("*") if p.exists()), default=folder.stat().st_mtime)
    return now - newest


def file_system(path: Path, mounts: str | None = None) -> str:
    """The type of the file system holding `path` (the longest mount point above it in /proc/mounts)."""
    if mounts is None:
        try:
            mounts = Path("/proc/mounts").read_text()
        except OSError:
            return "unknown"
    best, kind = "", "unknown"
    resolved = os.path.realpath(path)
    for line in mounts.splitlines():
        parts = line.split()
        if len(parts) >= 3 and (resolved == parts[1] or resolved.startswith(parts[1].rstrip("/") + "/")) and len(parts[1]) > len(best):
            best, kind = parts[1], parts[2]
    return kind


def clear_stale(root: Path | None = None, now: float | None = None) -> list[str]:
    """Remove the locks under `root` whose builder is gone; returns one line per lock found stale or left."""
    root = extensions_root() if root is None else root
    if not root.is_dir():
        return []
    now = time.time() if now is None else now
    lines = []
    for lock in [*root.glob("*/lock"), *root.glob("*/*/lock")]:
        try:
            idle = idle_seconds(lock.parent, now)
        except OSError:
            continue  # released while looked at
        if holders(lock):
            continue  # a build on this host is running
        shared = file_system(lock) in NETWORK_FILE_SYSTEMS
        if idle < (SHARED_IDLE_S if shared else LOCAL_IDLE_S):
            if shared:
                line = (f"{lock}: an extension-build lock that no process on this host holds, its folder written {idle:.0f} s ago: a build on another host, "
                        f"or one killed midway. Training waits until it goes; if no other host is building {lock.parent.name}, remove it: rm {lock}")
                log.warning("%s", line)
                lines.append(line)
            continue
        try:
            lock.unlink()
        except FileNotFoundError:
            continue
        line = f"removed {lock}: an extension-build lock left by a build that was killed (no process holds it, nothing written in its folder for {idle:.0f} s); {lock.parent.name} is built again"
        log.warning("%s", line)
        lines.append(line)
    return lines

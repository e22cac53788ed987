"""A build lock that holds on a shared filesystem without flock (Lustre mounted without it, NFS):
a marker file created atomically (O_CREAT | O_EXCL), kept alive by a heartbeat (its mtime touched
every few seconds), taken over when it goes stale.

Stale means: the marker's mtime did not change for STALE_SECONDS as seen by the waiter's own clock,
so clocks that differ between nodes do not matter; or its owner ran on this host and that process is
gone (a killed build on one machine is taken over at once). Two waiters taking over one stale marker: each
renames it to its own name first, and only the one whose rename succeeds removes it. What a build
publishes is renamed into place whole (store.py), so even a builder whose marker was taken over
never leaves anything half-built that a reader would use.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from tinytrain.cluster.local_process import running

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5.0
STALE_SECONDS = 60.0
POLL_SECONDS = 0.2


class BuildLock:
    """`with BuildLock(path, what):` waits while another process builds, then holds the marker."""

    def __init__(self, path: Path, what: str, heartbeat: float = HEARTBEAT_SECONDS, stale: float = STALE_SECONDS, poll: float = POLL_SECONDS):
        self.path = Path(path)
        self.what = what
        self.heartbeat, self.stale, self.poll = heartbeat, stale, poll
        self.token = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.waited = False  # whether another process held it first

    def __enter__(self) -> BuildLock:
        seen: tuple[int, float, str] | None = None  # (marker mtime, when this process first saw it, its owner)
        while not self._try_create():
            self.waited = True
            try:
                mtime = self.path.stat().st_mtime_ns
            except FileNotFoundError:
                continue
            now = time.monotonic()
            if seen is None or seen[0] != mtime:
                owner = self._owner()
                if seen is None:
                    log.info("%s: another process builds it (%s); waiting", self.what, owner)
                seen = (mtime, now, owner)
            elif now - seen[1] > self.stale or _dead_here(seen[2]):
                log.warning("%s: the builder's heartbeat stopped %.0f s ago (%s); taking over", self.what, now - seen[1], seen[2])
                self._take_over(seen[2])
                seen = None
                continue
            time.sleep(self.poll)
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {self.path.name}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._owner() == self.token:
            self.path.unlink(missing_ok=True)

    def _try_create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            json.dump({"token": self.token, "host": socket.gethostname(), "pid": os.getpid()}, f)
        return True

    def _owner(self) -> str:
        return _read_owner(self.path)

    def _take_over(self, stale_owner: str) -> None:
        grabbed = self.path.with_name(f"{self.path.name}.stale-{uuid.uuid4().hex[:8]}")
        try:
            os.rename(self.path, grabbed)  # atomic: of two takers, one gets it
        except FileNotFoundError:
            return
        if _read_owner(grabbed) != stale_owner:
            # Another taker replaced the stale marker first and this rename took its live one: put
            # it back (link fails if a third process created one meanwhile; its build is atomic anyway).
            try:
                os.link(grabbed, self.path)
            except FileExistsError:
                pass
        grabbed.unlink(missing_ok=True)

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            try:
                os.utime(self.path)
            except FileNotFoundError:  # taken over: the build still publishes atomically
                log.warning("%s: the build lock %s was taken over by another process", self.what, self.path)
                return


def _read_owner(path: Path) -> str:
    try:
        return json.loads(path.read_text())["token"]
    except (OSError, ValueError, KeyError):
        return "unknown"


def _dead_here(token: str) -> bool:
    """Whether the marker's owner ran on this host and its process no longer exists."""
    host, _, rest = token.partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and not running(int(pid))

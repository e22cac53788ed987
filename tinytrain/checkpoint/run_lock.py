"""One tinytrain process at a time in a run directory.

Two runs writing one directory corrupt each other's metrics.csv and checkpoints. Rank 0 takes an
exclusive `flock` on `<run dir>/.tinytrain.lock` for the run's life and writes who holds it there;
a second process is refused with that holder named. The kernel drops the lock when the process
ends, however it ends, so a crash leaves no stale lock. Filesystems without flock (some network
mounts) get a warning and no lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
from pathlib import Path

from tinytrain.config.resolvers import LOCK_NAME, holder_line
from tinytrain.errors import ConfigError, Problem

log = logging.getLogger(__name__)


@contextlib.contextmanager
def hold(run_dir: Path, what: str):
    """Hold the run directory's lock inside the block. `what`: the mode, for the other process's error."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / LOCK_NAME
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise ConfigError(
                Problem(
                    "hydra.run.dir",
                    str(run_dir),
                    f"is in use by {holder}; two runs in one directory would mix their metrics and checkpoints",
                    "wait for it to finish (or stop it), or give this run its own directory: run.name=<new>",
                )
            ) from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            log.warning("cannot lock %s (%s): nothing stops a second run from writing to this directory", path, e.strerror)
            yield
            return
        f.seek(0)
        f.truncate()
        f.write(holder_line(what))
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()

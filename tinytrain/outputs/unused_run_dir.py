"""A run directory that this command created and then left holding nothing of its own.

Hydra creates the run directory before tinytrain runs, with its record of the composition
(`.hydra`), the log and, once rank 0 holds it, the lock. A command refused before any work, or an
output mode whose outputs go beside the checkpoint it read (export, generate, average), would
otherwise leave one such `runs/<timestamp>/` per invocation. A directory that existed before the
command (a run's own, a Slurm job's requeue) or that holds anything else is never touched.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from tinytrain.config.resolvers import FOUND_BEFORE, GIVEN_RUN_DIRS, LOCK_NAME, MADE_ABOVE

# What Hydra and the lock put in every run directory; anything else is a mode's output.
BOOKKEEPING = {".hydra", "tinytrain.log", LOCK_NAME}


def remove_if_unused(run_dir: Path, refused: bool = False) -> bool:
    """Remove run_dir if this process's Hydra created it and it holds only BOOKKEEPING: one the
    command line named (hydra.run.dir=) only where the command was refused. Returns whether it was
    removed."""
    key = str(run_dir.resolve())
    if FOUND_BEFORE.get(key, True) or not run_dir.is_dir() or (key in GIVEN_RUN_DIRS and not refused):
        return False
    if any(entry.name not in BOOKKEEPING for entry in run_dir.iterdir()):
        return False
    logging.getLogger("tinytrain").debug("removing %s: this command wrote nothing there", run_dir)
    # The log's handler goes with its file: left, it would reopen tinytrain.log in the removed
    # folder for a later line (FileNotFoundError, in whatever logs next in this process).
    root = logging.getLogger()
    for handler in [h for h in root.handlers if isinstance(h, logging.FileHandler) and Path(h.baseFilename).resolve().is_relative_to(Path(key))]:
        root.removeHandler(handler)
        handler.close()
    shutil.rmtree(run_dir, ignore_errors=True)
    top = MADE_ABOVE.get(key)
    if top is not None:  # the parents created with it (runs/, a run.name's folders), while empty
        for parent in Path(key).parents:
            try:
                parent.rmdir()
            except OSError:
                break
            if parent == top:
                break
    return True

"""Atomic checkpoint writes for Lightning: a save in progress never replaces the last good one.

The file is written under a temp name next to its final one, flushed and fsynced, then renamed
into place (checkpoint_files.py). Lightning's own TorchCheckpointIO stages the file in the system
temp folder and moves it across filesystems, which is neither atomic nor durable, and holds a
second copy of the checkpoint in memory. DeepSpeed saves through its engine instead; strategy.py
gives its folder the same treatment.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import IO, Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from tinytrain.checkpoint.files import fsync_directory, step_checkpoints, temp_path
from tinytrain.errors import TrainingStopped, again_in


class AtomicCheckpointIO(TorchCheckpointIO):
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        final = Path(path)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path(final)
        try:
            with open(tmp, "wb") as f:
                self.write(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except (OSError, RuntimeError) as e:
            full = disk_full(e, final.parent)  # measured before the partial file is removed
            remove_quietly(tmp)
            if full:
                raise TrainingStopped(disk_full_message(final)) from e
            raise
        except BaseException:
            remove_quietly(tmp)
            raise
        fsync_directory(final.parent)

    def write(self, checkpoint: dict[str, Any], f: IO[bytes]) -> None:
        # Straight into the file: no second in-memory copy of a multi-GB checkpoint.
        torch.save(checkpoint, f)


def disk_full(error: BaseException, folder: Path) -> bool:
    """torch.save reports a full disk as "[enforce fail at inline_container.cc] unexpected pos ...":
    the free space left after the failed write tells (under 1% of the disk, at most 16 MiB)."""
    if isinstance(error, OSError) and error.errno == errno.ENOSPC:
        return True
    usage = shutil.disk_usage(folder)
    return usage.free < min(16 * 2**20, usage.total // 100)


def disk_full_message(final: Path) -> str:
    kept = [p for _, p in step_checkpoints(final.parent)]  # (a file of the same name is the old one, intact)
    previous = f"the previous checkpoint {kept[0].name} is intact" if kept else "no earlier checkpoint was lost"
    return (
        f"tinytrain: disk full while saving {final}; {previous} (a save in progress never replaces one). "
        f"Free space on {final.parent} (checkpoint.keep_last keeps fewer) and {again_in(final.parent.parent)}: resume=auto continues from the newest checkpoint."
    )


def remove_quietly(tmp) -> None:
    """The failed save's temp file, removed where it can be: on a disk turned read-only the removal
    fails too, and its error hid the save's own (the next run removes the file instead)."""
    with contextlib.suppress(OSError):
        tmp.unlink(missing_ok=True)


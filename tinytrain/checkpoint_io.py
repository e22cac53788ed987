"""Atomic checkpoint writes for Lightning: a save in progress never replaces the last good one.

The file is written under a temp name next to its final one, flushed and fsynced, then renamed
into place (checkpoint_files.py). Lightning's own TorchCheckpointIO stages the file in the system
temp folder and moves it across filesystems, which is neither atomic nor durable, and holds a
second copy of the checkpoint in memory. DeepSpeed saves through its engine instead; strategy.py
gives its folder the same treatment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO, Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

from tinytrain.checkpoint_files import fsync_directory, temp_path


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
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_directory(final.parent)

    def write(self, checkpoint: dict[str, Any], f: IO[bytes]) -> None:
        # Straight into the file: no second in-memory copy of a multi-GB checkpoint.
        torch.save(checkpoint, f)

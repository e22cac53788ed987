"""A DeepSpeed step folder (partitions of every rank) as one fp32 checkpoint, through Lightning's
converter, which maps the partitions' keys back to the module's. For the end of a run, the output
modes, averaging and `checkpoint.init_from`. Lightning is imported on use: the planning stages
import this folder."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

from tinytrain.checkpoint.safe_load import load_file

log = logging.getLogger(__name__)


def consolidate_deepspeed(folder: str | Path, out: str | Path) -> None:
    """A DeepSpeed checkpoint folder -> one fp32 state-dict file at `out`."""
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    log.info("consolidating the DeepSpeed checkpoint %s", folder)
    convert_zero_checkpoint_to_fp32_state_dict(str(folder), str(out))


def deepspeed_checkpoint(folder: str | Path, key: str) -> dict:
    """The folder consolidated through a temp file, as a checkpoint dict whose state dict is in
    memory (off the memory-mapped file that is removed). `key` names the setting in a load error."""
    with tempfile.TemporaryDirectory(prefix="tinytrain-consolidate-") as tmp:
        out = Path(tmp) / "consolidated.ckpt"
        consolidate_deepspeed(folder, out)
        ckpt = load_file(out, key)
        return {**ckpt, "state_dict": {k: v.clone() for k, v in ckpt["state_dict"].items()}}

"""One way from any checkpoint to the HF model's weights, for the end of a run (fit) and the output
modes (export, generate, eval, average): a file as it is, a sharded (fsdp_tp) folder read one
tensor at a time by the export, a DeepSpeed folder of partitions consolidated to one fp32 state dict
first (Lightning's converter, which maps its keys back to the module's)."""

from __future__ import annotations

from pathlib import Path

from tinytrain.checkpoint.deepspeed_weights import consolidate_deepspeed, deepspeed_checkpoint
from tinytrain.checkpoint.export import checkpoint_state_dict
from tinytrain.checkpoint.format import module_weights
from tinytrain.checkpoint.sharded import is_sharded


def model_weights(checkpoint: Path, *, keep_at: Path | None = None) -> dict:
    """The HF model's weights of `checkpoint`. A DeepSpeed folder's consolidated file is kept at
    `keep_at` when given (the end of a run keeps final.consolidated.ckpt), else in a temp folder."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir() or is_sharded(checkpoint):
        return checkpoint_state_dict(checkpoint)
    if keep_at is not None:
        consolidate_deepspeed(checkpoint, keep_at)
        return checkpoint_state_dict(keep_at)
    return module_weights(deepspeed_checkpoint(checkpoint, "export")["state_dict"])

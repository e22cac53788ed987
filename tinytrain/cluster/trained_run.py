"""Whether a run directory holds a trained run: what resume=auto would continue, what a plan or
an export must not overwrite the record of, what a multirun job must not take over.

Read from the names alone (no checkpoint/ import: the config stage's resolvers run before Hydra
writes anything): step<N>.ckpt (a file or DeepSpeed's folder) or final.ckpt; a save's temp name
ends otherwise.
"""

from __future__ import annotations

from pathlib import Path


def holds_checkpoints(run_dir: Path) -> bool:
    checkpoints = Path(run_dir) / "checkpoints"
    return any(checkpoints.glob("step*.ckpt")) or (checkpoints / "final.ckpt").exists()

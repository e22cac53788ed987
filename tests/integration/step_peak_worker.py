"""One rank of a whole tinytrain step's peak under fsdp_tp or a zero* strategy (gloo, CPU, 2 ranks).

Usage: RANK=r LOCAL_RANK=r WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python -m tests.integration.step_peak_worker OUT_DIR KEY=VALUE...
Trains three steps through tinytrain's own module and Trainer (tests/integration/test_guards.py
train) with benchmarks/allocator_count.py's step-peak callback; rank 0 writes each step's peak above
its start (the rank's weights and AdamW's state) and, under DeepSpeed, the most its ZeRO optimizer's
reduce buckets held during each step (stages 1 and 2 hold theirs through the backward only).
"""

import json
import sys
from pathlib import Path


def bucket_bytes(optimizer) -> int:
    """What ZeRO's reduce buckets hold: a list of buffers per dtype under stages 1 and 2, one under 3."""
    total = 0
    for bucket in getattr(optimizer, "ipg_buckets", {}).values():
        buffers = bucket.buffer if isinstance(bucket.buffer, list) else [bucket.buffer]
        total += sum(b.numel() * b.element_size() for b in buffers if b is not None)
    return total


def main(out_dir: Path, overrides: list[str]) -> None:
    import lightning.pytorch as pl
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode

    from benchmarks.allocator_count import step_peak_callback
    from tests.integration.test_guards import train

    class MostHeld(TorchDispatchMode):
        def __init__(self, optimizer):
            super().__init__()
            self.optimizer, self.most = optimizer, 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.most = max(self.most, bucket_bytes(self.optimizer))
            return out

    class Buckets(pl.Callback):
        def __init__(self):
            self.bytes = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            engine = getattr(trainer.strategy, "deepspeed_engine", None)
            self.reading = MostHeld(engine.optimizer if engine is not None else None)
            self.reading.__enter__()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.reading.__exit__(None, None, None)
            self.bytes.append(self.reading.most)

    reading, buckets = step_peak_callback(), Buckets()
    train(overrides, out_dir / "run", steps=3, callbacks=[reading, buckets])
    if dist.get_rank() == 0:
        (out_dir / "step_peak.json").write_text(json.dumps({"peaks": reading.peaks, "buckets": buckets.bytes}))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])

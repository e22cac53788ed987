"""One rank of a whole tinytrain step's peak under fsdp_tp (gloo, CPU, 2 data-parallel ranks).

Usage: RANK=r LOCAL_RANK=r WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python -m tests.integration.step_peak_worker OUT_DIR KEY=VALUE...
Trains three steps through tinytrain's own module and Trainer (tests/integration/test_guards.py
train) with benchmarks/allocator_count.py's step-peak callback; rank 0 writes each step's peak above
its start (the rank's weights and AdamW's state).
"""

import json
import sys
from pathlib import Path


def main(out_dir: Path, overrides: list[str]) -> None:
    import torch.distributed as dist

    from benchmarks.allocator_count import step_peak_callback
    from tests.integration.test_guards import train

    reading = step_peak_callback()
    train(overrides, out_dir / "run", steps=3, callbacks=[reading])
    if dist.get_rank() == 0:
        (out_dir / "step_peak.json").write_text(json.dumps(reading.peaks))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])

"""A tinytrain run in this process that records its peak CUDA memory when it ends:
`python benchmarks/peak_memory.py OUT.json key=value ...` is `python -m tinytrain key=value ...`
plus OUT.json holding torch's peak allocated and reserved GiB (nothing on a CPU). gpu_check.py
compares them with the plan's estimate."""

import atexit
import json
import sys


def record(path: str) -> None:
    import torch

    if torch.cuda.is_available():
        with open(path, "w") as f:
            json.dump({"allocated_gib": torch.cuda.max_memory_allocated() / 2**30, "reserved_gib": torch.cuda.max_memory_reserved() / 2**30}, f)


if __name__ == "__main__":
    out, sys.argv = sys.argv[1], ["tinytrain", *sys.argv[2:]]
    atexit.register(record, out)
    from tinytrain.cli import main

    main()

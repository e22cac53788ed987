"""A tinytrain run in this process that records its peak memory when it ends:
`python benchmarks/peak_memory.py OUT.json key=value ...` is `python -m tinytrain key=value ...`
plus OUT.json holding the process's peak resident host memory (GiB) and, on a GPU, torch's peak
allocated and reserved GiB. gpu_check.py compares them with the plan's estimates (the memory and
host lines)."""

import atexit
import json
import resource
import sys


def record(path: str) -> None:
    import torch

    peak = {"host_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}  # kB on Linux
    if torch.cuda.is_available():
        peak |= {"allocated_gib": torch.cuda.max_memory_allocated() / 2**30, "reserved_gib": torch.cuda.max_memory_reserved() / 2**30}
    with open(path, "w") as f:
        json.dump(peak, f)


if __name__ == "__main__":
    out, sys.argv = sys.argv[1], ["tinytrain", *sys.argv[2:]]
    atexit.register(record, out)
    from tinytrain.cli import main

    main()

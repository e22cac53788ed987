"""How a rank of a test's worker or a benchmark ends, once its results are written.

DTensor keeps gloo's groups alive past `destroy_process_group`: its caches, and
torch.distributed.nn.functional's default arguments, hold them (tinytrain/cluster/process_group.py
release() drops those for a run), and so do a worker's own mesh and model, alive in its frame. Gloo's
worker threads then still run when the interpreter finalizes, and a rank could abort there (SIGABRT,
"terminate called without an active exception": 1 run in ~60 of the tp-2 activation reading, after
its results were written). The worker leaves without finalizing, its results on disk and its
streams flushed.
"""

import os
import sys
from typing import NoReturn


def end_rank() -> NoReturn:
    """Wait for every rank (none leaves while another is mid-collective), destroy the group,
    flush, and exit 0 without the interpreter's finalization."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

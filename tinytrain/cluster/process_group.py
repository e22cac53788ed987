"""The end of a rank's process group: destroyed before the interpreter exits.

Lightning creates the process group and never destroys it. At interpreter exit Gloo's C++ worker
threads can still hold work objects with Python references; freeing them while the interpreter is
torn down aborts the process (SIGABRT, "terminate called without an active exception"), so a run
that finished could exit -6: seen on `mode=health cluster.devices=2` under load. PyTorch names the
cause and the remedy (call destroy_process_group() before exit) in pytorch/pytorch#179291."""

from __future__ import annotations

import sys


def release() -> bool:
    """Destroy this process's default process group, if it made one; whether it did. Only on a
    normal end: every rank has left its last collective, and destroying is local to the rank."""
    dist = sys.modules.get("torch.distributed")  # a run that never imported it has no group
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    dist.destroy_process_group()
    return True

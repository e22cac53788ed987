"""What glibc's allocator has handed out on this CPU, and the most it held across a stretch of torch
operators: the reading behind tests/activation_bytes.py (the plan's activation counts) and
benchmarks/long_context_layer.py --tiny. A CPU tensor is one malloc; nothing is cached.
"""

from __future__ import annotations

import ctypes

from torch.utils._python_dispatch import TorchDispatchMode


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def has_mallinfo2() -> bool:
    return hasattr(ctypes.CDLL("libc.so.6"), "mallinfo2")  # glibc 2.33 and newer


def allocated() -> int:
    """Bytes malloc has handed out and not had back (arena chunks and mmapped blocks)."""
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    return info.uordblks + info.hblkhd


class OperatorPeak(TorchDispatchMode):
    """The most allocated() read after any operator run inside it: each one's output beside its
    inputs, so a peak inside an autograd node is seen too."""

    most = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.most = max(self.most, allocated())
        return out

"""What glibc's allocator has handed out on this CPU, and the most it held across a stretch of torch
operators: the reading behind tests/activation_bytes.py (the plan's activation counts),
benchmarks/long_context_layer.py --tiny, and a training step's peak (step_peak_callback:
benchmarks/step_peak.py, tests/integration/test_step_memory.py). A CPU tensor is one malloc;
nothing is cached.
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


def gradient_bytes(params) -> int:
    return sum(p.grad.nbytes for p in params if p.grad is not None)


def step_peak_callback():
    """A Lightning callback whose `peaks` are each training step's most allocated() above its start,
    less any gradients left at that start (the step's own peak over the weights and optimizer
    state). Built on call: the other readers here import no Lightning."""
    import gc

    import lightning.pytorch as pl

    class StepPeak(pl.Callback):
        def __init__(self):
            self.peaks = []

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            gc.collect()
            self.start = allocated() - gradient_bytes(pl_module.parameters())
            self.reading = OperatorPeak()
            self.reading.__enter__()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.reading.__exit__(None, None, None)
            self.peaks.append(self.reading.most - self.start)

    return StepPeak()

"""The operations that bring a value from the device to the host: on a GPU each one waits for every
kernel queued before it (`.item()`, `float(t)`, `bool(t)`, `nonzero`, `torch.equal` reach torch's
dispatcher; `.tolist()`, `.cpu()` and `.numpy()` are seen as the tensor methods they are, since on
a CPU they never dispatch). A CPU run counts them the same way, so a test here can say that a path
makes none of them."""

import os
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::equal", "aten::is_nonzero", "aten::item"}
SYNC_METHODS = {torch.Tensor.tolist: "Tensor.tolist", torch.Tensor.cpu: "Tensor.cpu", torch.Tensor.numpy: "Tensor.numpy"}
TORCH = os.sep + "torch" + os.sep


class HostReads:
    """Records, in order, the host reads run while it is active (a forward; not a backward that
    recomputes a compiled forward, which a dispatch mode would change). `sites`: also where each
    was asked for, the frames outside torch innermost first ("package/module.py:line")."""

    def __init__(self, sites: bool = False):
        self.ops: list[str] = []
        self.sites: list[tuple[str, ...]] | None = [] if sites else None
        self._modes = (_Methods(self), _Ops(self))

    def record(self, name: str) -> None:
        self.ops.append(name)
        if self.sites is not None:
            frames = reversed(traceback.extract_stack())
            self.sites.append(tuple(f"{package_path(f.filename)}:{f.lineno}" for f in frames if TORCH not in f.filename and f.filename != __file__))

    def __enter__(self):
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc):
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


class _Ops(TorchDispatchMode):
    def __init__(self, reads: HostReads):
        super().__init__()
        self.reads = reads

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in SYNC_OPS:
            self.reads.record(func._schema.name)
        return func(*args, **(kwargs or {}))


class _Methods(TorchFunctionMode):
    def __init__(self, reads: HostReads):
        super().__init__()
        self.reads = reads

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in SYNC_METHODS:
            self.reads.record(SYNC_METHODS[func])
        return func(*args, **(kwargs or {}))


def package_path(filename: str) -> str:
    """'tinytrain/train/fit.py', 'transformers/masking_utils.py', ...: the path from the package's folder."""
    parts = filename.split(os.sep)
    for root in ("tinytrain", "transformers", "lightning", "lightning_utilities", "deepspeed", "tests"):
        if root in parts:
            return "/".join(parts[len(parts) - 1 - parts[::-1].index(root) :])
    return filename

"""The ops that bring a value from the device to the host: on a GPU each one waits for every kernel
queued before it (`.item()`, `int(t)`, `bool(t)`, `nonzero`, `torch.equal`). A CPU run counts them
the same way, so a test here can say that a path makes none of them."""

from torch.utils._python_dispatch import TorchDispatchMode

SYNC_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::equal", "aten::is_nonzero", "aten::item"}


class HostReads(TorchDispatchMode):
    """Records, in order, the host-reading ops run while it is active (a forward; not a backward
    that recomputes a compiled forward, which a dispatch mode would change)."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func._schema.name in SYNC_OPS:
            self.ops.append(func._schema.name)
        return func(*args, **(kwargs or {}))

"""The end of a rank's process group: destroyed before the interpreter exits.

Lightning creates the process group and never destroys it. At interpreter exit Gloo's C++ worker
threads can still hold work objects with Python references; freeing them while the interpreter is
torn down aborts the process (SIGABRT, "terminate called without an active exception"), so a run
that finished could exit -6: seen on `mode=health cluster.devices=2` under load. PyTorch names the
cause and the remedy (call destroy_process_group() before exit) in pytorch/pytorch#179291.

Destroying is not enough under fsdp_tp: a group lives on while a DeviceMesh holds it, and DTensor's
sharding caches hold the meshes of every operation they saw, and torch.distributed.nn.functional can
hold the default group in its default arguments (torch 2.13), so gloo's threads still ran at exit
after a 2-rank fsdp_tp run. Those references are dropped too, and the groups end here."""

from __future__ import annotations

import gc
import importlib
import sys
import types


def release() -> bool:
    """Destroy this process's default process group, if it made one; whether it did. Only on a
    normal end: every rank has left its last collective, and destroying is local to the rank."""
    dist = sys.modules.get("torch.distributed")  # a run that never imported it has no group
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return False
    dist.destroy_process_group()
    forget_dtensor_caches()
    forget_default_arguments(dist.ProcessGroup)
    gc.collect()
    return True


def forget_default_arguments(group_type) -> None:
    """torch.distributed.nn.functional's collectives take `group=group.WORLD` as a default argument,
    evaluated at import: imported after the group started (DTensor imports it on first use), they
    hold the default group for good. None is the same default, looked up at each call."""
    functional = sys.modules.get("torch.distributed.nn.functional")
    for fn in vars(functional).values() if functional is not None else ():
        defaults = getattr(fn, "__defaults__", None)
        if isinstance(fn, types.FunctionType) and defaults and any(isinstance(d, group_type) for d in defaults):
            fn.__defaults__ = tuple(None if isinstance(d, group_type) else d for d in defaults)


def forget_dtensor_caches() -> None:
    """Clear DTensor's caches of sharding decisions (Python's and the C++ fast path's, through the
    call torch's DTensor debug module recommends) and of redistribution plans: their entries hold
    meshes. Where a torch version names them otherwise, that cache is left."""
    if "torch.distributed.tensor._api" not in sys.modules:  # no DTensor was made
        return
    _collective_utils, _redistribute, debug = (_module(f"torch.distributed.tensor.{name}") for name in ("_collective_utils", "_redistribute", "debug"))
    topology = getattr(getattr(_collective_utils, "MeshTopoInfo", None), "build_from_mesh", None)  # cost estimates, by mesh
    for clear in (
        getattr(debug, "_clear_sharding_prop_cache", None),
        getattr(_redistribute, "clear_redistribute_planner_cache", None),
        getattr(getattr(_redistribute, "_gen_transform_infos", None), "cache_clear", None),
        getattr(topology, "cache_clear", None),
    ):
        if clear is not None:
            clear()


def _module(name: str):
    """The module, or None where this torch has no such module (the run has ended well: no error now)."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None

"""deepspeed.comm on a CPU without the op it would compile first."""

from __future__ import annotations


def skip_shared_memory_all_reduce() -> None:
    """DeepSpeed's CPU backend compiles its shared-memory all-reduce when deepspeed.comm starts (g++,
    ~50 CPU-s the first time in an environment: a CI run's), for `inference_all_reduce` only, which
    training never calls (its all-reduce is torch.distributed's over gloo): marked unavailable, it is
    not built. Called before every start of deepspeed.comm: the DeepSpeed strategy's and Ulysses'
    under fsdp_tp."""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False

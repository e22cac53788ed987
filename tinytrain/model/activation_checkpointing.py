"""Activation checkpointing on a built model, by the plan's mode (plan/checkpointing.py).

transformers checkpoints each decoder layer's forward (its module hooks, FSDP2's included, stay
outside) through torch.utils.checkpoint with the keyword arguments given here. Selective passes a
`context_fn` from torch's selective checkpoint API: the ops in `saved_ops()` keep their outputs,
every other op in the block is recomputed in backward (torchtitan's op-level policy). The model
itself knows nothing of this.
"""

from __future__ import annotations

import functools


def saved_ops() -> list:
    """The expensive ops whose outputs selective checkpointing keeps: matmuls, fused attention
    kernels, and tensor parallelism's reductions (recomputing them would repeat the communication).
    Batched matmuls (eager attention's scores) are recomputed, as Korthikanti et al. recompute the
    attention scores. Named by string so a torch without one of them still builds the list."""
    import torch

    names = {
        torch.ops.aten: ("mm", "addmm", "_scaled_mm", "_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention", "_flash_attention_forward", "_efficient_attention_forward"),
        torch.ops._c10d_functional: ("all_reduce", "reduce_scatter_tensor"),
        torch.ops.torch_attn: ("_varlen_attn",),  # torch's varlen kernel (packed documents), a custom op around the flash kernel
    }
    return [getattr(ns, name).default for ns, ops in names.items() for name in ops if hasattr(ns, name)]


def selective_context():
    """A fresh pair of forward/recompute contexts for one checkpointed call (torch asks per call)."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(saved_ops())


def checkpointed_whole(block) -> bool:
    """Whether transformers checkpoints this block whole, recomputing every op (full, or selective's
    every-k-th blocks): checkpointing is on and the checkpoint call has no op policy."""
    return block.gradient_checkpointing and "context_fn" not in block._gradient_checkpointing_func.keywords


def apply_checkpointing(model, mode: str, every: int = 1) -> None:
    """`mode`: none | full | selective (resolved, never auto); `every`: checkpoint every n-th block
    (selective where the strategy cannot take the op policy checkpoints whole blocks instead)."""
    if mode == "none":
        return
    kwargs = {"use_reentrant": False}
    if mode == "selective" and every == 1:
        kwargs["context_fn"] = functools.partial(selective_context)
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs=kwargs, every_n_layers=every)
    else:  # transformers before the rename (5.17, the GPU image's): the same switch under its old name
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs, every_n_layers=every)

"""torch.compile on a built model, by the plan's mode: each transformer block on its own
(`blocks`: one graph per block class, reused by every layer, so compile time does not grow with
depth) or the whole model as one graph (`model`). In place: parameter names, and so checkpoints,
stay unchanged.

Under ZeRO-3 a block's forward is compiled, not its call: `Module.compile` traces a module's own
hooks into its graph, and DeepSpeed's hooks guard on each layer's id, so every layer would compile
anew up to torch's recompile limit. Its layers gather their weights whole (model/zero3_layers.py),
so the forward holds no hook and compiles as one graph.

A block checkpointed whole has its checkpoint around the compiled forward, never inside it: AOT
autograd of a whole-block recompute under tensor parallelism saves the DeviceMesh among the
recompute's inputs and fails in the first backward (torch 2.13). transformers 5.17 checkpoints in a
layer's `__call__`, outside what is compiled; 5.23 checkpoints in its `forward`, so there the layer's
own forward is compiled and checkpointed here as transformers would. Selective checkpointing stays
inside the graph, where the compiler applies its op policy."""

from __future__ import annotations

import functools

from tinytrain.model.activation_checkpointing import checkpointed_whole


def blocks(model) -> list:
    """The repeated decoder layers (transformers marks them as GradientCheckpointingLayer)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def checkpoints_in_forward() -> bool:
    """transformers 5.23 checkpoints inside a layer's forward (5.17 in its __call__)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return "__call__" not in vars(GradientCheckpointingLayer)


def compile_inside_checkpoint(block, backend: str) -> None:
    """The layer's own forward compiled, transformers' checkpoint (its function and arguments) around it."""
    import torch

    own_forward = torch.compile(type(block).forward.__wrapped__.__get__(block), backend=backend)

    def forward(*args, **kwargs):
        if block.gradient_checkpointing and block.training:
            return block._gradient_checkpointing_func(functools.partial(own_forward, **kwargs), *args)
        return own_forward(*args, **kwargs)

    block.forward = forward


def apply_compile(model, mode: str, backend: str, *, zero3: bool = False) -> None:
    """After checkpointing (model/activation_checkpointing.py): a block it checkpoints whole gets the
    checkpoint around its compiled forward."""
    import torch

    if mode == "model":
        model.compile(backend=backend)
        return
    if mode != "blocks":
        return
    in_forward = checkpoints_in_forward()
    for block in blocks(model):
        if in_forward and checkpointed_whole(block):
            compile_inside_checkpoint(block, backend)
        elif zero3:
            block.forward = torch.compile(block.forward, backend=backend)
        else:
            block.compile(backend=backend)

"""torch.compile on a built model, by the plan's mode: each transformer block on its own
(`blocks`: one graph per block class, reused by every layer, so compile time does not grow with
depth) or the whole model as one graph (`model`). In place: parameter names, and so checkpoints,
stay unchanged.

Under ZeRO-3 a block's forward is compiled, not its call: `Module.compile` traces a module's own
hooks into its graph, and DeepSpeed's hooks guard on each layer's id, so every layer would compile
anew up to torch's recompile limit. Its layers gather their weights whole (model/zero3_layers.py),
so the forward holds no hook and compiles as one graph."""

from __future__ import annotations


def blocks(model) -> list:
    """The repeated decoder layers (transformers marks them as GradientCheckpointingLayer)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def apply_compile(model, mode: str, backend: str, *, zero3: bool = False) -> None:
    if mode == "blocks" and zero3:
        import torch

        for block in blocks(model):
            block.forward = torch.compile(block.forward, backend=backend)
    elif mode == "blocks":
        for block in blocks(model):
            block.compile(backend=backend)
    elif mode == "model":
        model.compile(backend=backend)

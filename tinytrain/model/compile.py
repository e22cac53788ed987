"""torch.compile on a built model, by the plan's mode: each transformer block on its own
(`blocks`: one graph per block class, reused by every layer, so compile time does not grow with
depth) or the whole model as one graph (`model`). In place (`nn.Module.compile`): parameter names,
and so checkpoints, stay unchanged."""

from __future__ import annotations


def blocks(model) -> list:
    """The repeated decoder layers (transformers marks them as GradientCheckpointingLayer)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def apply_compile(model, mode: str, backend: str) -> None:
    if mode == "blocks":
        for block in blocks(model):
            block.compile(backend=backend)
    elif mode == "model":
        model.compile(backend=backend)

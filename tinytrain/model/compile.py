"""torch.compile on a built model, by the plan's mode: each transformer block on its own
(`blocks`: one graph per block class, reused by every layer, so compile time does not grow with
depth) or the whole model as one graph (`model`). In place (`nn.Module.compile`): parameter names,
and so checkpoints, stay unchanged.

Compiled blocks under tensor parallelism: the vocab-sharded embedding (model/tensor_parallel.py)
hands the first block its all-reduced output as funcol's AsyncCollectiveTensor, and torch 2.13's
compiled call takes such an input's waited tensor as a leaf, so no gradient reaches the embedding
(silently: every other gradient is right; tests/integration/tp_compile_worker.py compares each
one with the eager model's). The embedding's output is made a plain tensor before any block sees it.
"""

from __future__ import annotations


def blocks(model) -> list:
    """The repeated decoder layers (transformers marks them as GradientCheckpointingLayer)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def waited(module, inputs, output):
    """A forward hook: an AsyncCollectiveTensor output as a plain tensor that keeps its autograd
    history (an op on it waits and returns a plain tensor; `wait()` alone would drop the history)."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return output.clone() if isinstance(output, AsyncCollectiveTensor) else output


def apply_compile(model, mode: str, backend: str) -> None:
    if mode == "blocks":
        model.get_input_embeddings().register_forward_hook(waited)
        for block in blocks(model):
            block.compile(backend=backend)
    elif mode == "model":
        model.compile(backend=backend)

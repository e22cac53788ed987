"""Under ZeRO-3 each decoder layer is a DeepSpeed leaf module: DeepSpeed gathers all of a layer's
weights in the layer's own hooks, around its call, as FSDP2 does per block, where it would
otherwise gather each linear's inside the layer. With no gather inside a layer, torch's selective
checkpoint replays the layer's recompute as it ran (a gather inside breaks the replay: "c10d.
_allgather_base_.default encountered during backward but not found in storage") and a compiled
layer's forward is one graph (model/compile.py). The memory model already counts one layer's
weights gathered at once (plan/memory.py, largest_layer_params)."""

from __future__ import annotations

from tinytrain.model.compile import blocks


def gather_layers_whole(model) -> None:
    """Before deepspeed.initialize, which installs its hooks on every module not inside a leaf."""
    from deepspeed.utils import set_z3_leaf_modules

    layers = blocks(model)
    if not layers:
        return
    set_z3_leaf_modules(model, list({type(layer) for layer in layers}))
    if not any(p.requires_grad for p in model.get_input_embeddings().parameters()):
        # DeepSpeed reduces a leaf's gradients in a full backward hook, which torch fires before the
        # layer's own backward where none of its inputs needs a gradient: the first layer's under a
        # frozen embedding (LoRA). There it reduced the first layer's adapters before their gradients
        # existed ("The size of tensor a (0) must match ..."), so the embedding's output needs one.
        model.enable_input_require_grads()

"""FSDP2 x tensor parallelism for Llama-family models, applied by Lightning's ModelParallelStrategy.

Megatron-style split: q/k/v and gate/up projections column-wise (each rank owns whole heads and
a slice of the MLP), o/down projections row-wise (partial sums all-reduced); the embedding and
lm_head are split by vocab rows, which is why the vocab is padded to a multiple of
vocab_multiple x tp. The lm_head's logits are gathered (Replicate) so the loss can drop the
padding columns exactly as without TP. HF's attention reshapes with -1 heads, so each rank runs
its num_heads / tp heads unchanged.
"""

from __future__ import annotations


def tp_plan(model) -> dict:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan = {
        "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        "lm_head": ColwiseParallel(output_layouts=Replicate()),
    }
    for i, _ in enumerate(model.model.layers):
        prefix = f"model.layers.{i}"
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            plan[f"{prefix}.{name}"] = ColwiseParallel()
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            plan[f"{prefix}.{name}"] = RowwiseParallel()
    return plan


def parallelize(model, device_mesh) -> None:
    """Shard `model` (an HF causal LM) in place over mesh dims 'tensor_parallel' and 'data_parallel'."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    tp_mesh = device_mesh["tensor_parallel"]
    if tp_mesh.size() > 1:
        parallelize_module(model, tp_mesh, tp_plan(model))
    dp_mesh = device_mesh["data_parallel"]
    for layer in model.model.layers:
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)

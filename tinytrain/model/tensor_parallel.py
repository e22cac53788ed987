"""FSDP2 x tensor parallelism for the built model, applied by Lightning's ModelParallelStrategy.

Megatron-style split: q/k/v and gate/up projections column-wise (each rank owns whole heads and
a slice of the MLP), o/down projections row-wise (partial sums all-reduced); the embedding and
lm_head are split by vocab rows, which is why the vocab is padded to a multiple of
vocab_multiple x tp. The lm_head's logits are gathered (Replicate) so the loss can drop the
padding columns exactly as without TP. HF's attention reshapes with -1 heads, so each rank runs
its num_heads / tp heads unchanged.

Which layers are split how is read from the built model: transformers' `base_model_tp_plan` of
its family (layer patterns -> colwise/rowwise), matched against the model's module names; a family
whose plan is not plainly column/row-wise (Phi-3's fused qkv_proj) is refused by name.
"""

from __future__ import annotations

import re

from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.families import tp_problems


def module_name(model, module) -> str:
    return next(name for name, m in model.named_modules() if m is module)


def tp_plan(model) -> dict:
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    family = model.config.model_type
    layer_plan = model.config.base_model_tp_plan
    problems = tp_problems(layer_plan, family)
    if problems:
        raise ConfigError(problems)
    plan = {
        module_name(model, model.get_input_embeddings()): RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate()),
        module_name(model, model.get_output_embeddings()): ColwiseParallel(output_layouts=Replicate()),
    }
    names = [name for name, _ in model.named_modules()]
    for pattern, style in layer_plan.items():
        # "layers.*.self_attn.q_proj" is relative to the base model ("model."), * a layer index.
        regex = re.compile(re.escape(f"{model.base_model_prefix}.{pattern}").replace(r"\*", r"\d+"))
        matched = [name for name in names if regex.fullmatch(name)]
        if not matched:
            raise ConfigError(Problem("parallel", "fsdp_tp", f"the {family} model has no module matching {pattern!r} of its tensor-parallel plan", "use parallel=ddp or zero2/zero3 for this model"))
        for name in matched:
            plan[name] = ColwiseParallel() if style == "colwise" else RowwiseParallel()
    return plan


def parallelize(model, device_mesh) -> None:
    """Shard `model` (an HF causal LM) in place over mesh dims 'tensor_parallel' and 'data_parallel'."""
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    tp_mesh = device_mesh["tensor_parallel"]
    if tp_mesh.size() > 1:
        parallelize_module(model, tp_mesh, tp_plan(model))
    dp_mesh = device_mesh["data_parallel"]
    for layer in getattr(model, model.base_model_prefix).layers:
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)

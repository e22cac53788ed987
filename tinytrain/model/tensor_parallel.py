"""FSDP2 x tensor parallelism for the built model, applied by Lightning's ModelParallelStrategy.

Megatron-style split: q/k/v and gate/up projections column-wise (each rank owns whole heads and
a slice of the MLP), o/down projections row-wise (partial sums all-reduced); the embedding and
lm_head are split by vocab rows, which is why the vocab is padded to a multiple of
vocab_multiple x tp. The lm_head's logits are gathered (Replicate) so the loss can drop the
padding columns exactly as without TP. HF's attention reshapes with -1 heads, so each rank runs
its num_heads / tp heads unchanged.

Qwen3's and Gemma-3's q_norm / k_norm normalise each head over its head_dim between the
column-split projection and attention, so each rank normalises its own heads with the same weight
(transformers' style `replicated_with_grad_allreduce`). head_norm_parallel keeps the weight a
Replicate DTensor and hands the norm its input as the heads' shard of the whole (Shard on the
heads dimension): the forward is local, and the weight's gradient (a sum over every head) comes
out Partial and is all-reduced over the tensor-parallel ranks, so the replicas stay equal.

A loss from hidden states (the chunked loss) reads the final norm's output and calls the lm_head
outside the model's forward, but FSDP2 gathers the root's weights (embedding, final norm, lm_head)
only around a forward: the root gets one more forward method (torch's
register_fsdp_forward_method), IN_ROOT_FORWARD, which runs a function between the root's pre- and
post-forward hooks, so those weights are gathered for it and their gradients reduced after it.

The embedding's all-reduced output is torch's AsyncCollectiveTensor (the parallel style
redistributes asynchronously), and a compiled block (trainer.compile=blocks) takes such an input's
waited tensor as a leaf: the embedding got no gradient at all, silently (torch 2.13; every other
gradient was right; tests/integration/tp_compile_worker.py compares each with the eager model's).
`plain_output`, a hook after the style's own, hands the first block a plain tensor instead.

Which layers are split how is read from the built model: transformers' `base_model_tp_plan` of
its family (layer patterns -> colwise/rowwise), matched against the model's module names; a family
whose plan is not plainly column/row-wise (Phi-3's fused qkv_proj) is refused by name.
"""

from __future__ import annotations

import re

from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.families import tp_problems


def head_norm_parallel(heads: int):
    """The style for a norm over each head (the last dimension) of a tensor whose `heads` heads are
    split over the tensor-parallel ranks (a torch ParallelStyle, for parallelize_module's plan)."""
    from torch import nn
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_module, distribute_tensor
    from torch.distributed.tensor.parallel import ParallelStyle

    class HeadNormParallel(ParallelStyle):
        def _apply(self, module, mesh):
            local_heads = heads // mesh.size()

            def replicate(name, mod, mesh):
                for key, param in list(mod.named_parameters(recurse=False)):
                    mod.register_parameter(key, nn.Parameter(distribute_tensor(param, mesh, [Replicate()]), requires_grad=param.requires_grad))

            def shard_input(mod, inputs, mesh):
                x = inputs[0]
                # (batch, seq, heads, head_dim) as Qwen3 normalises, (batch, heads, seq, head_dim) as Gemma-3.
                heads_dim = x.ndim - 2 if x.shape[-2] == local_heads else 1
                return (DTensor.from_local(x, mesh, [Shard(heads_dim)], run_check=False), *inputs[1:])

            return distribute_module(module, mesh, replicate, shard_input, lambda mod, out, mesh: out.to_local())

    return HeadNormParallel()


def plain_output(module, inputs, output):
    """A forward hook: an AsyncCollectiveTensor output as a plain tensor that keeps its autograd
    history (an op on it waits and returns a plain tensor; `wait()` alone would drop the history).
    One copy of the hidden states per step."""
    from torch.distributed._functional_collectives import AsyncCollectiveTensor

    return output.clone() if isinstance(output, AsyncCollectiveTensor) else output


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
            if style == "replicated_with_grad_allreduce":
                config = model.config
                plan[name] = head_norm_parallel(config.num_attention_heads if name.endswith("q_norm") else config.num_key_value_heads)
            else:
                plan[name] = ColwiseParallel() if style == "colwise" else RowwiseParallel()
    return plan


IN_ROOT_FORWARD = "tinytrain_in_root_forward"


def _call(fn, *args):
    return fn(*args)


def in_root_forward(model, fn, *args):
    """fn(*args) inside the FSDP root's forward hooks where `model` is sharded; a plain call otherwise."""
    return getattr(model, IN_ROOT_FORWARD, _call)(fn, *args)


def parallelize(model, device_mesh) -> None:
    """Shard `model` (an HF causal LM) in place over mesh dims 'tensor_parallel' and 'data_parallel'."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
    from torch.distributed.tensor.parallel import parallelize_module

    tp_mesh = device_mesh["tensor_parallel"]
    if tp_mesh.size() > 1:
        parallelize_module(model, tp_mesh, tp_plan(model))
        model.get_input_embeddings().register_forward_hook(plain_output)  # after the style's hook
    dp_mesh = device_mesh["data_parallel"]
    for layer in getattr(model, model.base_model_prefix).layers:
        fully_shard(layer, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    setattr(model, IN_ROOT_FORWARD, _call)
    register_fsdp_forward_method(model, IN_ROOT_FORWARD)

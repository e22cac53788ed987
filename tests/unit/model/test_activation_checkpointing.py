"""Every activation-checkpointing and compile mode computes the same gradients as none/eager, and
selective keeps what it says it keeps: no matmul is recomputed in backward, while full recomputes
each one (counted by a dispatch mode during backward)."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tinytrain.config.schema import Arch
from tinytrain.model.activation_checkpointing import apply_checkpointing, saved_ops
from tinytrain.model.compile import apply_compile, blocks


def tiny_llama(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, use_cache=False, attn_implementation="sdpa")
    return LlamaForCausalLM(config).train()


BATCH = torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1))


def gradients(model) -> dict:
    model.zero_grad()
    model(input_ids=BATCH, labels=BATCH).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


class CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        return func(*args, **(kwargs or {}))


def backward_matmuls(model) -> int:
    loss = model(input_ids=BATCH, labels=BATCH).loss
    with CountMatmuls() as counter:
        loss.backward()
    return counter.count


@pytest.mark.parametrize(("mode", "every"), [("full", 1), ("selective", 1), ("selective", 2)])
def test_checkpointing_modes_give_the_gradients_of_none(mode, every):
    reference = gradients(tiny_llama())
    model = tiny_llama()
    apply_checkpointing(model, mode, every)
    got = gradients(model)
    assert got.keys() == reference.keys()
    for name, grad in got.items():
        torch.testing.assert_close(grad, reference[name], atol=1e-6, rtol=0, msg=name)


def test_selective_recomputes_no_matmul_and_full_recomputes_all():
    plain = backward_matmuls(tiny_llama())
    full, selective = tiny_llama(), tiny_llama()
    apply_checkpointing(full, "full")
    apply_checkpointing(selective, "selective")
    # q, k, v, o, gate, up again per layer; the recompute stops before down_proj, whose output
    # backward does not need (torch's non-reentrant checkpoint stops early)
    assert backward_matmuls(full) == plain + 3 * 6
    assert backward_matmuls(selective) == plain
    assert torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default in saved_ops()


def test_every_second_block_checkpoints_half_the_layers():
    model = tiny_llama()
    apply_checkpointing(model, "selective", every=2)
    assert [b.gradient_checkpointing for b in blocks(model)] == [True, False, True]


@pytest.mark.parametrize("mode", ["blocks", "model"])
def test_compile_modes_give_the_gradients_of_eager(mode):
    """aot_eager: dynamo's graphs and AOT autograd's backward without generating code (a CI budget)."""
    torch._dynamo.reset()
    reference = gradients(tiny_llama())
    model = tiny_llama()
    apply_checkpointing(model, "selective")
    apply_compile(model, mode, "aot_eager")
    got = gradients(model)
    for name, grad in got.items():
        torch.testing.assert_close(grad, reference[name], atol=1e-6, rtol=0, msg=name)
    compiled = [b for b in blocks(model) if b._compiled_call_impl is not None]
    assert len(compiled) == (3 if mode == "blocks" else 0)


def saved_outside_checkpoints(model) -> int:
    """Tensors a forward saves for backward outside any checkpoint: a checkpoint's own hooks take
    what is saved inside it, so these hooks see the rest (a compiled graph's saved tensors too)."""
    count = 0

    def pack(tensor):
        nonlocal count
        count += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(input_ids=BATCH, labels=BATCH).loss
    loss.backward()
    return count


def family_model(arch, seed: int = 0):
    """A tiny model of a family (transformers' model_type), eager attention (Gemma-2's soft-capping)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    config = AutoConfig.for_model(arch.value, vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8, use_cache=False, pad_token_id=0)
    return AutoModelForCausalLM.from_config(config, attn_implementation="eager").train()


@pytest.mark.parametrize("arch", list(Arch), ids=lambda a: a.value)
def test_every_family_s_blocks_checkpointed_whole_compile_with_eager_s_gradients(arch):
    """model/compile.py compiles the layer's own forward under the checkpoint: whatever wraps each
    family's decoder layer (transformers 5.23 wraps its forward), full checkpointing with compiled
    blocks gives the eager, uncheckpointed model's gradients, bit for bit under aot_eager."""
    torch._dynamo.reset()
    reference = gradients(family_model(arch))
    model = family_model(arch)
    apply_checkpointing(model, "full")
    apply_compile(model, "blocks", "aot_eager")
    got = gradients(model)
    assert got.keys() == reference.keys()
    for name, grad in got.items():
        torch.testing.assert_close(grad, reference[name], atol=0, rtol=0, msg=name)


def test_compiled_blocks_checkpointed_whole_keep_what_eager_full_keeps():
    """A block checkpointed in full and compiled has its checkpoint around the compiled forward
    (model/compile.py; transformers 5.23 puts it inside, where torch cannot train it at tp > 1): the
    forward saves outside the checkpoints what eager full saves, far less than the compiled
    uncheckpointed blocks, and the gradients are eager's."""
    torch._dynamo.reset()
    reference = gradients(tiny_llama())
    eager_full, compiled_none, compiled_full = tiny_llama(), tiny_llama(), tiny_llama()
    apply_checkpointing(eager_full, "full")
    apply_compile(compiled_none, "blocks", "aot_eager")
    apply_checkpointing(compiled_full, "full")
    apply_compile(compiled_full, "blocks", "aot_eager")
    assert saved_outside_checkpoints(compiled_full) == saved_outside_checkpoints(eager_full) < saved_outside_checkpoints(compiled_none) / 4
    for name, grad in gradients(compiled_full).items():
        torch.testing.assert_close(grad, reference[name], atol=1e-6, rtol=0, msg=name)

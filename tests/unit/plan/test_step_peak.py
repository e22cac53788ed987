"""Where a step peaks (plan/step_peak.py): what holds the gradients beside the activations, fsdp_tp's
gathered weights, and the optimizer step's temporaries, the last measured here on torch's own
optimizers."""

import gc

import pytest
import torch

from tests.conftest import plan
from tinytrain.plan.memory import ModelStateMemory
from tinytrain.plan.model_shape import shape_from_hf
from tinytrain.plan.optimizer import OptimizerPlan
from tinytrain.plan.step_peak import HELD, ZERO3_SUB_GROUP, StepShape, deepspeed_flat_elements, optimizer_step_bytes, render_sum, step_peak

GIB = 2**30
STATES = ModelStateMemory(params=4.0 * GIB, grads=4.0 * GIB, optimizer=8.0 * GIB)


def test_the_total_is_the_largest_of_the_three_places_a_step_peaks():
    # Held gradients and nothing else: the plain sum.
    assert step_peak(STATES, 10 * GIB, 0.0, HELD).total == 26 * GIB
    freed = StepShape(grads_held=False, optimizer_step=1.0 * GIB)
    assert (step_peak(STATES, 10 * GIB, 0.0, freed).total, step_peak(STATES, 10 * GIB, 0.0, freed).at) == (22 * GIB, "backward")
    assert (step_peak(STATES, 2 * GIB, 0.0, freed).total, step_peak(STATES, 2 * GIB, 0.0, freed).at) == (17 * GIB, "optimizer_step")
    # Fused AdamW (no temporaries), no recompute: the backward's end adds nothing to the gradients and
    # is not in the memory line, so the peak is named the optimizer step's (it was the backward's end).
    fused = StepShape(grads_held=False, optimizer_step=0.0)
    assert step_peak(STATES, 2 * GIB, 0.0, fused).at == "optimizer_step"
    # fsdp_tp: gathered weights beside both the activations and, with the first layer's recompute, every gradient.
    fsdp = StepShape(grads_held=False, gathered=1.0 * GIB, unsharded_grads=0.5 * GIB)
    assert step_peak(STATES, 1 * GIB, 0.25 * GIB, fsdp).total == 12 * GIB + 4 * GIB + 1.75 * GIB
    assert step_peak(STATES, 1 * GIB, 0.25 * GIB, fsdp).at == "backward_end"


def memory_of(overrides, tmp_path) -> dict:
    return plan(["hardware.gpu=H100", *overrides], tmp_path)["memory_per_gpu"]


@pytest.mark.parametrize(
    ("overrides", "held", "why"),
    [
        (["trainer.global_batch_size=8", "trainer.micro_batch_size=8"], False, "freed with each optimizer step"),
        (["trainer.global_batch_size=16", "trainer.micro_batch_size=8"], True, "accumulation 2"),
        (["parallel=ddp", "cluster.devices=2", "trainer.global_batch_size=16", "trainer.micro_batch_size=8"], True, "DDP's gradient buckets"),
        (["parallel=zero2", "cluster.devices=2", "trainer.global_batch_size=16", "trainer.micro_batch_size=8"], True, "DeepSpeed's flat gradient buffers"),
        (["parallel=fsdp_tp", "parallel.tp=1", "cluster.devices=2", "trainer.global_batch_size=16", "trainer.micro_batch_size=8"], False, "freed with each optimizer step"),
    ],
)
def test_what_holds_the_gradients_through_the_forward(tmp_path, overrides, held, why):
    m = memory_of(overrides, tmp_path)
    assert m["step"]["grads_held"] is held and why in m["step"]["why"]
    fixed = m["params_gib"] + m["optimizer_gib"]
    in_backward = fixed + (m["grads_gib"] if held else 0.0) + m["activations_gib"] + m["step"]["gathered_gib"] + m["step"]["unsharded_grads_gib"]
    assert m["total_gib"] >= in_backward - 0.002
    assert (m["step"]["gathered_gib"] > 0) is ("parallel=fsdp_tp" in overrides)


def test_the_memory_line_keeps_the_plain_sum_where_every_gradient_is_held(tmp_path):
    zero2 = memory_of(["parallel=zero2", "cluster.devices=2"], tmp_path / "zero2")
    assert render_sum(zero2).startswith(f"params {zero2['params_gib']:.2f} + grads {zero2['grads_gib']:.2f} + optimizer")
    single = memory_of(["trainer.global_batch_size=8", "trainer.micro_batch_size=8"], tmp_path / "single")
    line = render_sum(single)
    assert "max(the backward: activations" in line and "the optimizer step: grads" in line and "(fused AdamW)" in line
    assert line.endswith("peak in the backward (the gradients are freed with each optimizer step)")
    muon = memory_of(["trainer.global_batch_size=8", "trainer.micro_batch_size=8", "trainer.optimizer=muon"], tmp_path / "muon")
    assert "(fused AdamW and Muon)" in render_sum(muon) and muon["step"]["optimizer_step_gib"] > 0  # Muon's largest matrix
    fsdp = memory_of(["parallel=fsdp_tp", "parallel.tp=1", "cluster.devices=2", "trainer.activation_checkpointing=full"], tmp_path / "fsdp")
    assert "gathered weights" in render_sum(fsdp) and "the backward's end: grads" in render_sum(fsdp) and "(foreach AdamW)" in render_sum(fsdp)


def llama():
    import transformers

    config = transformers.LlamaConfig(hidden_size=256, intermediate_size=704, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=4096)
    return list(transformers.AutoModelForCausalLM.from_config(config).parameters()), shape_from_hf(config, 4096)


def step_peak_of(optimizer, params) -> int:
    """What one optimizer step allocates at its most, after a first step has built the state."""
    from benchmarks.allocator_count import OperatorPeak, allocated, has_mallinfo2

    if not has_mallinfo2():
        pytest.skip("glibc before 2.33 has no mallinfo2")
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer.step()
    gc.collect()
    start = allocated()
    with OperatorPeak() as reading:
        optimizer.step()
    return reading.most - start


@pytest.mark.parametrize(("kernel", "options"), [("per-tensor", {"foreach": False}), ("foreach", {"foreach": True}), ("fused", {"fused": True})])
def test_adamw_s_step_allocates_what_the_plan_counts(kernel, options):
    params, shape = llama()
    trainable = sum(p.numel() for p in params)
    counted = optimizer_step_bytes(kernel, OptimizerPlan("adamw", 0, trainable), shape, trainable=trainable, shards=1)
    measured = step_peak_of(torch.optim.AdamW(params, lr=1e-3, **options), params)
    if kernel == "fused":
        assert counted == 0 and measured < 0.01 * 4 * trainable
    elif kernel == "foreach":
        assert measured == pytest.approx(counted, rel=0.02)  # the square root of every second moment
    else:
        assert 2 / 3 * counted <= measured <= counted  # two of the largest tensor's, and the one before


@pytest.mark.parametrize("kernel", ["per-tensor", "foreach"])
def test_zero_s_flat_partition_steps_as_the_plan_counts(kernel):
    """ZeRO hands torch's AdamW one flat fp32 tensor per parameter group, its partition of the group:
    foreach's square root, and the per-tensor loop's temporaries, are then a whole partition's (the
    plan counted none under DeepSpeed: 2 CPU ranks of 150M parameters read 1.6-1.9x the count under
    ZeRO-2, benchmarks/step_peak_ranks.py)."""
    params, shape = llama()
    trainable, world = sum(p.numel() for p in params), 2
    flat = deepspeed_flat_elements(trainable, world, zero_stage=2)
    partition = [torch.nn.Parameter(torch.randn(int(flat)))]
    counted = optimizer_step_bytes(kernel, OptimizerPlan("adamw", 0, trainable), shape, trainable=trainable, shards=world, flat=flat)
    measured = step_peak_of(torch.optim.AdamW(partition, lr=1e-3, foreach=kernel == "foreach"), partition)
    if kernel == "foreach":
        assert measured == pytest.approx(counted, rel=0.02)
    else:
        assert 0.6 * counted <= measured <= counted, (measured, counted)  # one tensor: its square root and quotient


def test_zero3_steps_its_partition_in_sub_groups():
    assert deepspeed_flat_elements(8 * 10**9, 8, zero_stage=2) == 10**9
    assert deepspeed_flat_elements(70 * 10**9, 8, zero_stage=3) == ZERO3_SUB_GROUP
    assert deepspeed_flat_elements(70 * 10**9, 8, zero_stage=2) == 70 * 10**9 / 8


def test_what_zero_s_optimizer_step_allocates_on_a_gpu(tmp_path):
    """foreach AdamW over the partition on a GPU (tinytrain hands DeepSpeed torch's AdamW); with the
    optimizer offloaded DeepSpeed's CPU Adam steps on the host and the GPU holds none of it."""
    run = plan(["hardware.gpu=H100", "parallel=zero2", "cluster.devices=2"], tmp_path / "zero2")
    step = run["memory_per_gpu"]["step"]
    assert step["optimizer_kernel"] == "foreach"
    assert step["optimizer_step_gib"] == pytest.approx(4 * run["params"]["total"] / 2 / GIB, abs=0.001)
    offload = memory_of(["parallel=zero2_offload", "cluster.devices=2"], tmp_path / "offload")["step"]
    assert (offload["optimizer_kernel"], offload["optimizer_step_gib"]) == ("offloaded", 0.0)


@pytest.mark.parametrize("ns_dtype", ["bfloat16", "float32"])
def test_muon_s_step_allocates_at_most_what_the_plan_counts(ns_dtype):
    from tinytrain.model.optimizers import muon_optimizer

    matrices = [torch.nn.Parameter(torch.randn(704, 256)), torch.nn.Parameter(torch.randn(256, 256))]
    options = {"lr": 1e-3, "momentum": 0.95, "nesterov": True, "adjust_lr_fn": "match_rms_adamw"}
    trainable = sum(p.numel() for p in matrices)
    _, shape = llama()
    counted = optimizer_step_bytes("fused", OptimizerPlan("muon", trainable, 0, (704, 256), ns_dtype), shape, trainable=trainable, shards=1)
    measured = step_peak_of(muon_optimizer([{"params": matrices}], ns_dtype, options), matrices)
    assert 0.5 * counted <= measured <= counted, (measured, counted)

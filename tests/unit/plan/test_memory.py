"""The plan's model-state memory matches DeepSpeed's own estimators; oversubscription warns."""

import pytest
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

from tests.conftest import plan
from tinytrain.plan.parallel import model_state_memory

PARAMS, LARGEST = 6_738_415_616, 131_072_000  # Llama-2-7B and its embedding table


@pytest.mark.parametrize("gpus, nodes", [(1, 1), (8, 1), (8, 4)])
@pytest.mark.parametrize("offload", [False, True])
def test_zero2_matches_deepspeed(gpus, nodes, offload):
    _, expected = estimate_zero2_model_states_mem_needs(PARAMS, gpus, nodes, cpu_offload=offload)
    ours = model_state_memory("deepspeed", PARAMS, world=gpus * nodes, tp=1, zero_stage=2, offload_optimizer=offload)
    assert ours.total == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("gpus, nodes", [(1, 1), (8, 1), (8, 4)])
@pytest.mark.parametrize("offload_opt, offload_params", [(False, False), (True, False), (True, True)])
def test_zero3_matches_deepspeed(gpus, nodes, offload_opt, offload_params):
    _, expected, _ = estimate_zero3_model_states_mem_needs(PARAMS, LARGEST, gpus, nodes, cpu_offload=offload_opt, cpu_offload_params=offload_params)
    ours = model_state_memory("deepspeed", PARAMS, world=gpus * nodes, tp=1, zero_stage=3, offload_optimizer=offload_opt, offload_params=offload_params, largest_layer_params=LARGEST)
    assert ours.total == pytest.approx(expected, rel=1e-6)


def test_tp_divides_model_states():
    full = model_state_memory("fsdp_tp", PARAMS, world=8, tp=1)
    tp = model_state_memory("fsdp_tp", PARAMS, world=8, tp=4)
    assert full.total == pytest.approx(16 * PARAMS / 8) and tp.total == pytest.approx(full.total)
    assert model_state_memory("fsdp_tp", PARAMS, world=4, tp=4).total == pytest.approx(16 * PARAMS / 4)
    assert model_state_memory("ddp", PARAMS, world=8, tp=1).total == pytest.approx(16 * PARAMS)


def test_a_run_that_does_not_fit_is_refused_before_it_starts(tmp_path):
    # A 7B model's states on one V100 (the whole model, fp32 Adam): refused with the estimate and the
    # levers left; relaxed to a warning, planned with the memory line saying so.
    from tinytrain.errors import ConfigError

    with pytest.raises(ConfigError) as refused:
        plan(["model=llama2_7b", "hardware.gpu=V100"], tmp_path)
    message = str(refused.value)
    assert "parallel='single': [preflight memory] the plan's estimate is" in message and "x the 29.8 GiB of the V100" in message
    assert "Fix: try parallel=zero3 on more GPUs" in message and "(or relax with preflight.memory=warn|off)" in message
    p = plan(["model=llama2_7b", "hardware.gpu=V100", "preflight.memory=warn"], tmp_path)
    assert p["memory_per_gpu"]["fits"] is False and "does NOT fit" in p["memory_per_gpu"]["note"]
    assert [f["check"] for f in p["preflight"]["findings"]] == ["memory"]
    p = plan(["model=llama2_7b", "hardware.gpu=A800", "parallel=zero3", "cluster.devices=8"], tmp_path)
    assert p["memory_per_gpu"]["fits"] is True and not p["preflight"]["findings"]


@pytest.mark.parametrize(
    ("overrides", "named", "not_named"),
    [
        # the model states alone fill the GPU: a shorter sequence or smaller micro batch cannot help
        (["model=llama3_8b"], ["parallel=zero3 on more GPUs", "parallel=zero3_offload", "a GPU with more memory"], ["higher ZeRO stage", "parallel.tp", "activation_checkpointing", "micro_batch_size"]),
        (["model=llama3_1_8b", "parallel=zero3", "cluster.devices=2", "trainer.micro_batch_size=1", "trainer.activation_checkpointing=full", "data.seq_len=8192", "trainer.global_batch_size=2"], ["parallel=zero3_offload (the optimizer state and weights in host memory)", "more GPUs"], ["parallel=zero3 ", "activation_checkpointing", "micro_batch_size"]),
        (["model=llama3_8b", "parallel=fsdp_tp", "parallel.tp=2", "cluster.devices=2"], ["a larger parallel.tp (now 2; e.g. parallel.tp=4, which divides num_heads(32) and num_kv_heads(8))", "more GPUs"], ["zero3"]),
    ],
)
def test_a_memory_line_that_does_not_fit_names_only_the_levers_left(tmp_path, overrides, named, not_named):
    # A ZeRO-3 run at micro batch 1 with full checkpointing was told to try a higher ZeRO stage or a
    # smaller micro batch.
    note = plan(["hardware.gpu=A10", "preflight.memory=warn", *overrides], tmp_path)["memory_per_gpu"]["note"]
    assert note.startswith("does NOT fit") and "; try " in note, note
    fixes = note.split("; try ", 1)[1]
    assert all(n in fixes for n in named) and not any(n in fixes for n in not_named), fixes


def test_memory_levers_name_only_what_the_run_can_take():
    """finetune=qlora runs on single and ddp (no ZeRO lever); a larger parallel.tp only where the kv
    heads take it; states_only leaves out the activations' levers."""
    from types import SimpleNamespace

    from tinytrain.plan.memory import memory_levers

    single = SimpleNamespace(tp=1, zero_stage=0, offload_optimizer=False)
    qlora = memory_levers(single, deepspeed=False, tensor_parallel=False, checkpointing="none", micro_batch=2, qlora=True)
    assert qlora == ["trainer.activation_checkpointing=full", "a smaller trainer.micro_batch_size (now 2)"]
    tp8 = SimpleNamespace(tp=8, zero_stage=0, offload_optimizer=False)
    levers = memory_levers(tp8, deepspeed=False, tensor_parallel=True, checkpointing="full", micro_batch=1, heads=(32, 8))
    assert levers == ["more GPUs (the states are partitioned over them)"]
    levers = memory_levers(SimpleNamespace(tp=2, zero_stage=0, offload_optimizer=False), deepspeed=False, tensor_parallel=True, checkpointing="none", micro_batch=4, heads=(32, 8), states_only=True)
    assert levers == ["more GPUs (the states are partitioned over them)", "a larger parallel.tp (now 2; e.g. parallel.tp=4, which divides num_heads(32) and num_kv_heads(8))"]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_in_fp32_holds_4_byte_weights_and_gradients(stage):
    """precision=fp32 under DeepSpeed: the module's weights and gradients are fp32 (4 B), and the
    plan counted them at 2 B as in bf16/fp16, under the GPU."""
    from tinytrain.plan.memory import StateLayout, deepspeed_states

    p, layout = 1_000_000, dict(world=8, tp=1, zero_stage=stage)
    half, full = deepspeed_states(p, StateLayout(**layout)), deepspeed_states(p, StateLayout(**layout, fp32=True))
    shards = 8 if stage == 3 else 1
    assert full.params - half.params == pytest.approx(2 * p / shards)
    grads = {1: 2 * p, 2: 2 * p / 8, 3: 0}[stage]  # ZeRO-1's whole gradient, ZeRO-2's partition; ZeRO-3 counts its fp32 partition only
    assert full.grads - half.grads == pytest.approx(grads)
    assert full.optimizer == half.optimizer  # the fp32 master and the moments either way


def test_a_deepspeed_reference_copy_in_fp32_is_counted_at_4_bytes():
    from tinytrain.plan.preference import reference_bytes

    half = reference_bytes("deepspeed", 1_000_000, world=8, tp=1, zero_stage=2, offload_params=False)
    full = reference_bytes("deepspeed", 1_000_000, world=8, tp=1, zero_stage=2, offload_params=False, fp32=True)
    assert (half, full) == (2_000_000, 4_000_000)

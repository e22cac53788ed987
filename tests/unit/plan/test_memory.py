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


def test_plan_warns_when_it_does_not_fit(tmp_path):
    p = plan(["model=llama2_7b", "hardware.gpu=V100"], tmp_path)
    assert p["memory_per_gpu"]["fits"] is False and "does NOT fit" in p["memory_per_gpu"]["note"]
    p = plan(["model=llama2_7b", "hardware.gpu=A800", "parallel=zero3", "cluster.devices=8"], tmp_path)
    assert p["memory_per_gpu"]["fits"] is True

"""The DeepSpeed config is generated from the composed config and checked by DeepSpeed itself."""

import json

import pytest

from tests.conftest import compose, plan
from tinytrain.errors import ConfigError

CLUSTER = ["parallel=zero2", "cluster.nodes=2", "cluster.devices=8", "trainer.micro_batch_size=4", "trainer.global_batch_size=256"]


def test_v100_fp16_block_is_the_loss_scale_policy(tmp_path):
    p = plan([*CLUSTER, "hardware.gpu=V100", "precision.loss_scale.initial_scale_power=12", "precision.loss_scale.window=200"], tmp_path)
    ds = p["deepspeed"]
    # The two values given on the command line and the policy's defaults, each in its DeepSpeed key.
    assert p["precision"]["loss_scale"] == {"initial_scale_power": 12, "window": 200, "hysteresis": 2, "min_scale": 1.0}
    assert ds["fp16"] == {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 200, "hysteresis": 2, "min_loss_scale": 1.0}
    assert "bf16" not in ds


def test_a800_is_bf16_and_batch_matches_world(tmp_path):
    p = plan([*CLUSTER, "hardware.gpu=A800"], tmp_path)
    ds = p["deepspeed"]
    assert ds["bf16"] == {"enabled": True} and "fp16" not in ds
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"], ds["train_batch_size"]) == (4, 4, 256)  # 256 / (4 x 16)
    assert ds["zero_optimization"]["stage"] == 2 and ds["gradient_clipping"] == 1.0
    assert json.loads((tmp_path / "deepspeed_config.json").read_text()) == ds


@pytest.mark.parametrize(
    "option, stage, offload_opt, offload_param",
    [("zero1", 1, False, False), ("zero3", 3, False, False), ("zero2_offload", 2, True, False), ("zero3_offload", 3, True, True)],
)
def test_stage_and_offload(option, stage, offload_opt, offload_param, tmp_path):
    zero = plan([f"parallel={option}", "hardware.gpu=V100"], tmp_path)["deepspeed"]["zero_optimization"]
    assert zero["stage"] == stage
    assert ("offload_optimizer" in zero) == offload_opt and ("offload_param" in zero) == offload_param


@pytest.mark.parametrize(
    "override, needle",
    [
        ("+parallel.deepspeed_overrides.bf16.enabled=true", "bfloat16 and fp16 modes cannot be simultaneously enabled"),
        ("+parallel.deepspeed_overrides.fp16.loss_scale_window=-1", "loss_scale_window must be > 0"),
        ("+parallel.deepspeed_overrides.zero_optimization.bucket_sise=5", "Extra inputs are not permitted"),
        ("+parallel.deepspeed_overrides.gradient_clipping=abc", "non-negative number"),
        # the plan counts the reduce bucket from the override before DeepSpeed reads it: no traceback
        ("+parallel.deepspeed_overrides.zero_optimization.reduce_bucket_size=abc", "unable to parse string as an integer"),
        ("+parallel.deepspeed_overrides.zero_optimisation.stage=3", "did you mean 'zero_optimization'"),
    ],
)
def test_invalid_overrides_rejected_with_their_name(override, needle, tmp_path):
    with pytest.raises(ConfigError) as e:
        plan([*CLUSTER, "hardware.gpu=V100", override], tmp_path)
    msg = str(e.value)
    name = override.removeprefix("+").split("=")[0]
    assert name in msg and needle in msg, msg


def test_valid_override_is_merged(tmp_path):
    ds = plan([*CLUSTER, "hardware.gpu=A800", "+parallel.deepspeed_overrides.zero_optimization.reduce_bucket_size=50000000"], tmp_path)["deepspeed"]
    assert ds["zero_optimization"]["reduce_bucket_size"] == 50000000 and ds["zero_optimization"]["stage"] == 2


def test_deepspeed_training_on_cpu_is_refused_before_building(tmp_path):
    from tinytrain.plan.validate import validate

    with pytest.raises(ConfigError) as e:
        validate(compose(["parallel=zero2"]))
    assert "CUDA" in str(e.value) and "mode=plan" in str(e.value)


def test_lightning_gets_the_config_without_gradient_accumulation_steps(tmp_path):
    """Lightning sets gradient_accumulation_steps from accumulate_grad_batches and refuses a config
    that has it (tests/integration/test_deepspeed.py trains through it); deepspeed_config.json
    keeps it: it is what DeepSpeed runs with."""
    from tinytrain.plan.deepspeed_config import for_lightning

    ds = plan([*CLUSTER, "hardware.gpu=A800"], tmp_path)["deepspeed"]
    handed = for_lightning(ds)
    assert "gradient_accumulation_steps" not in handed and ds["gradient_accumulation_steps"] == 4
    assert {k: v for k, v in ds.items() if k != "gradient_accumulation_steps"} == handed
    handed["zero_optimization"]["stage"] = 3  # Lightning edits its copy; the plan's stays as planned
    assert ds["zero_optimization"]["stage"] == 2


def test_training_deepspeed_without_cuda_is_refused_unless_the_test_switch_says_so():
    from tinytrain.plan.validate import validate

    with pytest.raises(ConfigError) as e:
        validate(compose(["parallel=zero2"]))
    problem = e.value.problems[0]
    assert (problem.key, problem.value) == ("parallel", "zero2") and "only on CUDA GPUs" in problem.message
    assert "parallel.deepspeed_on_cpu" in problem.message  # named as the testing switch it is
    validate(compose(["parallel=zero2", "parallel.deepspeed_on_cpu=true"]))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_reduce_bucket_is_sized_by_the_model_and_counted_among_the_gradients(stage, tmp_path):
    """DeepSpeed's default reduce bucket (5e8 elements) is allocated whatever the model: two under
    ZeRO-1/2, one under ZeRO-3 (tests/integration/test_step_memory.py reads them from its optimizer).
    tinytrain sizes it hidden^2 as Transformers' "auto" does, and the memory line counts it; an
    override of it is counted as given."""
    from tinytrain.plan.deepspeed_config import bucket_bytes

    run = [f"parallel=zero{stage}", "cluster.devices=8", "model=llama3_8b", "hardware.gpu=H100", "trainer.activation_checkpointing=full"]
    sized = plan(run, tmp_path / "sized")
    assert sized["deepspeed"]["zero_optimization"]["reduce_bucket_size"] == 4096 * 4096
    given = plan([*run, "+parallel.deepspeed_overrides.zero_optimization.reduce_bucket_size=500000000"], tmp_path / "given")
    assert given["deepspeed"]["zero_optimization"]["reduce_bucket_size"] == 500_000_000
    more = (given["memory_per_gpu"]["grads_gib"] - sized["memory_per_gpu"]["grads_gib"]) * 2**30
    assert more == pytest.approx(bucket_bytes(stage, 500_000_000, 2) - bucket_bytes(stage, 4096 * 4096, 2), rel=1e-3)
    assert more == pytest.approx((1 if stage == 3 else 2) * 2 * (5e8 - 4096**2), rel=1e-3)  # 1.8 GiB under ZeRO-2 in bf16

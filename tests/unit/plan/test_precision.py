import pytest

from tinytrain.errors import ConfigError
from tinytrain.plan.hardware import CPU, gpu_from_device_name, lookup_gpu
from tinytrain.plan.precision import Dtype, LossScalePolicy, resolve_precision

POLICY = LossScalePolicy(initial_scale_power=12, window=200, hysteresis=3, min_scale=0.5)


def test_v100_auto_is_fp16_with_the_loss_scale_policy():
    d = resolve_precision(lookup_gpu("V100"), "auto", POLICY)
    assert d.lightning == "16-mixed"
    assert d.loss_scale == POLICY
    assert "7.0" in d.reason and "V100" in d.reason


@pytest.mark.parametrize("gpu", ["A800", "A100", "H100", "H800", "H20", "L40S", "RTX4090", "A10"])
def test_ampere_and_newer_auto_is_bf16(gpu):
    d = resolve_precision(lookup_gpu(gpu), "auto", POLICY)
    assert d.lightning == "bf16-mixed"
    assert d.loss_scale is None
    assert "bf16 because compute capability" in d.reason


def test_t4_is_fp16_even_when_torch_reports_emulated_bf16(monkeypatch):
    import torch

    # torch.cuda.is_bf16_supported() says True on a T4 (emulated); the policy must not ask it.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    t4 = gpu_from_device_name("Tesla T4", (7, 5))
    d = resolve_precision(t4, "auto", POLICY)
    assert d.lightning == "16-mixed"
    assert d.loss_scale == POLICY


def test_cpu_auto_is_fp32():
    d = resolve_precision(CPU(), "auto", POLICY)
    assert (d.dtype, d.lightning, d.loss_scale) == (Dtype.fp32, "32-true", None)


def test_bf16_on_v100_is_an_error_naming_gpu_and_fix():
    with pytest.raises(ConfigError) as e:
        resolve_precision(lookup_gpu("V100"), "bf16", POLICY)
    msg = str(e.value)
    assert "V100" in msg and "precision=fp16" in msg and "bf16" in msg


def test_explicit_fp16_on_cpu_keeps_policy():
    d = resolve_precision(CPU(), "fp16", POLICY)
    assert d.lightning == "16-mixed" and d.loss_scale == POLICY
    assert "GradScaler" in d.reason
    # Under DeepSpeed its engine scales the loss (on a CPU too): the reason says whose scaler runs.
    ds = resolve_precision(CPU(), "fp16", POLICY, deepspeed=True)
    assert ds.loss_scale == POLICY and "DeepSpeed's loss scaler" in ds.reason and "GradScaler" not in ds.reason


def test_policy_maps_to_deepspeed_and_grad_scaler():
    ds = POLICY.to_deepspeed()
    assert ds == {"enabled": True, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 200, "hysteresis": 3, "min_loss_scale": 0.5}
    gs = POLICY.to_grad_scaler_kwargs()
    assert gs["init_scale"] == 2.0**12 and gs["growth_interval"] == 200 and gs["backoff_factor"] == 0.5


def test_one_dtype_carries_its_torch_dtype_and_lightning_name():
    import torch

    from tinytrain.config.dtype import Dtype as ConfigDtype

    assert Dtype is ConfigDtype  # one type: the plan's decision is what finetune, export and fit take
    assert [(d.torch, d.lightning) for d in Dtype] == [(torch.bfloat16, "bf16-mixed"), (torch.float16, "16-mixed"), (torch.float32, "32-true")]
    assert all(Dtype.from_lightning(d.lightning) is d for d in Dtype)
    assert (Dtype.from_lightning("bf16-true"), Dtype.from_lightning("16-true"), Dtype.from_lightning("32")) == (Dtype.bf16, Dtype.fp16, Dtype.fp32)


def test_the_loss_scale_line_says_hysteresis_only_where_deepspeed_applies_it(tmp_path, capsys):
    """torch's GradScaler (single, ddp, fsdp_tp) halves at every overflow: the line said
    "hysteresis 2" there too, and the run halved at its first overflow."""
    from tests.conftest import plan

    plan(["hardware.gpu=V100"], tmp_path / "single")
    assert "loss scale dynamic: start 2^16, grow after 1000 clean steps, halved at every overflow (torch's GradScaler has no hysteresis)" in capsys.readouterr().out
    plan(["hardware.gpu=V100", "parallel=zero2"], tmp_path / "zero2")
    assert "grow after 1000 clean steps, hysteresis 2, minimum 1.0" in capsys.readouterr().out

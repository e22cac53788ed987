"""The Yi-6B failure on CPU: a pretrained Llama whose <|im_start|>/<|im_end|> rows were never
trained, fine-tuned in fp16 (real autocast + GradScaler through Lightning's MixedPrecision plugin)
on ChatML data with an aggressive loss-scale policy.

Why it overflows: every ChatML sample starts with <|im_start|>, and a position whose embedding is
~0 stays ~0 through the layers (it attends only to itself). RMSNorm's backward at a ~0 input
multiplies the gradient by 1/sqrt(eps) (~316), once per norm the position crosses, so gradients
reaching the lower layers overflow fp16 at loss scales a healthy model trains at. With the check
relaxed the scale halves step after step and the loss-scale guard stops the run naming the rows;
with the default policy preflight rewrites the rows and the same run trains.

The same through DeepSpeed ZeRO-2 fp16 (two ranks on DeepSpeed's CPU accelerator), where the
failure came from: DeepSpeed's own loss scaler halves down to `min_loss_scale` and then raises
"Current loss scale already at minimum"; tinytrain's guard stops first, with its diagnosis.
"""

import math

import pytest

from tests.conftest import (
    DEEPSPEED_ON_CPU,
    logged,
    run_cli,
    write_untrained_chat_rows_model,
)

pytestmark = pytest.mark.slow

CHAT = 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]'
# Twelve thin layers: the overflow compounds per layer, as it does in a deep model.
SHAPE = ["model.num_layers=12", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128", "model.max_position_embeddings=256"]
# fp16 starting at 2^24: a healthy model needs 6 halvings (steps 0-5) to find its scale; the
# loss-scale guard's default (guard.loss_scale_halvings=8) leaves room for that.
FINE_TUNE = [
    "data=chat",
    CHAT,
    "data.seq_len=128",
    "precision=fp16",
    "precision.loss_scale.initial_scale_power=24",
    "trainer.max_steps=16",
    "trainer.warmup_steps=2",
    "trainer.micro_batch_size=4",
    "trainer.log_every_n_steps=1",
    "trainer.val_every_n_steps=1000",
    "trainer.progress_bar=false",
    "trainer.export=false",
    "trainer.plot=false",
]
RELAXED = ["model.untrained_tokens=warn", "preflight.precision_risk=warn"]
ZERO2 = ["parallel=zero2", *DEEPSPEED_ON_CPU]
# A floor of 2^20 sits above where this model's scale collapses: DeepSpeed halves 2^24 down to it
# within a few steps and raises on the next overflow there.
HIGH_FLOOR = "precision.loss_scale.min_scale=1048576"
DEEPSPEED_GIVES_UP = "Current loss scale already at minimum"


@pytest.fixture(scope="module")
def yi_like(tmp_path_factory):
    return write_untrained_chat_rows_model(tmp_path_factory.mktemp("yi_like"), SHAPE, common_direction_std=0.05)


def test_relaxed_check_hits_the_collapse_guard_naming_the_tokens(yi_like, tmp_path):
    r = run_cli([*FINE_TUNE, f"model.pretrained={yi_like}", *RELAXED], tmp_path / "run")
    assert r.returncode == 3, r.stderr[-3000:]
    msg = r.stderr
    assert "fp16 loss scale collapsed" in msg and "8 halvings in a row" in msg, msg[-3000:]
    assert "untrained embedding rows that preflight found and was told not to fix: '<|im_end|>', '<|im_start|>'" in msg
    assert "model.untrained_tokens=mean" in msg
    # The non-finite guard defers to the loss-scale guard under fp16 scaling: every step skipped.
    assert all(not math.isfinite(n) for n in logged(tmp_path / "run", "grad_norm"))


def test_default_policy_fixes_the_rows_and_trains(yi_like, tmp_path):
    r = run_cli([*FINE_TUNE, f"model.pretrained={yi_like}"], tmp_path / "run")
    assert r.returncode == 0, r.stderr[-3000:]
    out = r.stdout + r.stderr
    for token in ("<|im_start|>", "<|im_end|>"):
        assert f"{token!r}" in out and "rewrote" in out.lower(), out[-3000:]
    losses = logged(tmp_path / "run", "loss")
    scales = logged(tmp_path / "run", "loss_scale")
    assert len(losses) == 16 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    # The scale settles where a healthy model's does (2^18 here), far above the relaxed run's.
    assert min(scales) >= 2.0**17, scales


def test_deepspeed_fp16_without_the_guard_dies_in_deepspeed(yi_like, tmp_path):
    """What the guard prevents: the run tinytrain stops below, with the guard disarmed."""
    args = [*FINE_TUNE, f"model.pretrained={yi_like}", *RELAXED, *ZERO2, HIGH_FLOOR]
    r = run_cli(args, tmp_path / "run", env={"TT_TEST_NO_LOSS_SCALE_GUARD": "1"}, module="tests.integration.instrumented_cli")
    # Both ranks raise DeepSpeed's exception: rank 0 raises it too (exit 1), or first sees rank 1
    # gone and says so in one line pointing at that error (exit 3).
    assert r.returncode in (1, 3) and DEEPSPEED_GIVES_UP in r.stderr, r.stderr[-3000:]
    if r.returncode == 3:
        assert "failed (exit status 1)" in r.stderr and "its error is printed above" in r.stderr, r.stderr[-3000:]
    assert min(logged(tmp_path / "run", "loss_scale")) == 2.0**20


def test_deepspeed_fp16_guard_stops_first_naming_the_tokens(yi_like, tmp_path):
    r = run_cli([*FINE_TUNE, f"model.pretrained={yi_like}", *RELAXED, *ZERO2, HIGH_FLOOR], tmp_path / "run")
    assert r.returncode == 3, r.stderr[-3000:]
    msg = r.stderr
    assert DEEPSPEED_GIVES_UP not in msg
    assert "fp16 loss scale collapsed" in msg and "down to the floor precision.loss_scale.min_scale=1.04858e+06" in msg, msg[-3000:]
    assert "untrained embedding rows that preflight found and was told not to fix: '<|im_end|>', '<|im_start|>'" in msg
    assert "1.67772e+07 -> 1.04858e+06" in msg  # 2^24 down to the floor 2^20
    scales = logged(tmp_path / "run", "loss_scale")
    assert scales[:2] == [2.0**24, 2.0**23]  # DeepSpeed's hysteresis 2: the first overflow does not halve
    # Every step was skipped, and the LR schedule waited with DeepSpeed (still at its first warm-up value).
    lrs = logged(tmp_path / "run", "lr")
    assert len(lrs) >= 4 and lrs == pytest.approx([1.5e-3] * len(lrs))


def test_deepspeed_fp16_default_policy_fixes_the_rows_and_trains(yi_like, tmp_path):
    r = run_cli([*FINE_TUNE, f"model.pretrained={yi_like}", *ZERO2], tmp_path / "run")
    assert r.returncode == 0, r.stderr[-3000:]
    losses = logged(tmp_path / "run", "loss")
    scales = logged(tmp_path / "run", "loss_scale")
    assert len(losses) == 16 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    assert min(scales) >= 2.0**17, scales

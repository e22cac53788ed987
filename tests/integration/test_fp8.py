"""precision.fp8 on CPU through torchao's emulation (precision.fp8_emulate): a short bf16 run with
float8 linear layers tracks the same run without them, its step checkpoint resumes to the same
metrics, and the export holds bf16 weights under the usual names (issue 34)."""

import importlib.util

import pytest
import torch
from safetensors import safe_open

from tests.conftest import metrics_rows, run_cli

pytestmark = [pytest.mark.slow, pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao (the fp8 extra) is not installed")]

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
COMMON = ["experiment=smoke", *MODEL, "precision=bf16", "trainer.progress_bar=false", "trainer.plot=false", "trainer.log_every_n_steps=1", "export.dtype=bf16"]
FP8 = ["precision.fp8=true", "precision.fp8_emulate=true"]
# Float8 (e4m3 forward, e5m2 gradients, per-tensor scales) against bf16: each step's loss within 2%.
BOUND = 0.02
COMPARED = ("loss", "lr", "grad_norm", "val_loss")


def losses(run_dir) -> list[float]:
    return [float(r["loss"]) for r in metrics_rows(run_dir) if r.get("loss")]


def rows_from(run_dir, first_step: int) -> list:
    return [(r["step"], {k: r[k] for k in COMPARED if r.get(k)}) for r in metrics_rows(run_dir) if int(r["step"]) >= first_step]


def exported(run_dir) -> dict:
    with safe_open(run_dir / "hf_export" / "model.safetensors", "pt") as f:
        return {k: f.get_tensor(k).dtype for k in f.keys()}


@pytest.mark.timeout(600)
def test_emulated_float8_tracks_bf16_resumes_and_exports_bf16(tmp_path):
    base = run_cli(COMMON, tmp_path / "bf16")
    assert base.returncode == 0, base.stderr[-3000:]
    r = run_cli([*COMMON, *FP8], tmp_path / "fp8")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "fp8        on: as configured: torchao's emulation" in r.stdout
    assert "float8 training: 14 linear layers converted" in (tmp_path / "fp8" / "tinytrain.log").read_text()
    ours, theirs = losses(tmp_path / "fp8"), losses(tmp_path / "bf16")
    assert len(ours) == len(theirs) == 8
    assert all(abs(a - b) <= BOUND * b for a, b in zip(ours, theirs)), (ours, theirs)
    assert ours != theirs  # float8 did run

    step4 = tmp_path / "fp8" / "checkpoints" / "step0000004.ckpt"
    resumed = run_cli([*COMMON, *FP8, f"resume={step4}", "trainer.export=false"], tmp_path / "resumed")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert rows_from(tmp_path / "resumed", 4) == rows_from(tmp_path / "fp8", 4)

    dtypes = exported(tmp_path / "fp8")
    assert dtypes.keys() == exported(tmp_path / "bf16").keys()
    assert set(dtypes.values()) == {torch.bfloat16}


@pytest.mark.timeout(300)
def test_a_preference_run_s_reference_computes_in_float8_as_its_policy_does(tmp_path):
    """DPO's frozen reference was copied before the policy's layers became float8: step 0's implicit
    rewards carried the fp8-vs-bf16 gap (loss 0.700173 where the definition gives ln 2)."""
    r = run_cli(["experiment=dpo_smoke", "precision=bf16", *FP8, "trainer.max_steps=3", "trainer.log_every_n_steps=1", "trainer.progress_bar=false", "trainer.plot=false", "trainer.export=false"], tmp_path / "dpo")
    assert r.returncode == 0, r.stderr[-3000:]
    first = metrics_rows(tmp_path / "dpo")[0]
    assert float(first["loss"]) == pytest.approx(0.6931472, abs=1e-6) and float(first["rewards/margins"]) == 0.0, first

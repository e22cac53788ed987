"""benchmarks/gpu_check.sh end to end on a CPU (--dry-run): a tiny model for a few steps in fp32 and
fp16, flash-attn isolation on the CPU stand-in kernel, mfu.py; DeepSpeed, compile and liger are
reported as skipped. On a GPU machine the same script runs the full check."""

import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_gpu_check_dry_run_prints_the_summary_table(tmp_path):
    result = subprocess.run(
        ["bash", "benchmarks/gpu_check.sh", "--dry-run", "--work", str(tmp_path)],
        cwd=REPO, env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=600,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    table = result.stdout[result.stdout.index("gpu_check (dry run on CPU"):]
    rows = {line.split("|")[0].strip(): line for line in table.splitlines() if "|" in line}
    for check in ("train single_fp32", "train zero2_fp32", "train single_fp16", "flash-attn packing isolation", "mfu.py plain"):
        assert rows[check].split("|")[1].strip() == "ok", rows[check]
    assert "export reloads" in rows["train single_fp32"]
    assert "loss scale" in rows["train single_fp16"]
    assert "cpu reference" in rows["flash-attn packing isolation"]
    assert "skipped (dry run: zero2 shows the DeepSpeed path on CPU)" in rows["train zero3_bf16"]

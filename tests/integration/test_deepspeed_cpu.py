"""The generated DeepSpeed configs drive real optimizer steps through deepspeed.initialize (CPU, gloo).

Lightning's DeepSpeedStrategy refuses CPU, so this runs DeepSpeed's engine directly with the
config tinytrain generates and the optimizer the LightningModule configures. The first run
builds DeepSpeed's CPU ops (shared-memory comm ~30 s, cpu_adam ~70 s for the offload case).
"""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("option, stage, offload", [("zero1", 1, False), ("zero2", 2, False), ("zero2_offload", 2, True)])
def test_generated_config_trains(option, stage, offload, tmp_path):
    out = tmp_path / "result.json"
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".venv" / "torch_extensions"))
    env["MASTER_PORT"] = str(29611 + stage + 10 * offload)
    r = subprocess.run([sys.executable, "-m", "tests.integration.deepspeed_worker", option, str(out)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["zero_stage"] == stage
    assert result["config"]["zero_optimization"]["stage"] == stage
    assert ("offload_optimizer" in result["config"]["zero_optimization"]) == offload
    assert result["optimizer"] == ("DeepSpeedCPUAdam" if offload else "AdamW")
    assert result["offload"] == offload
    losses = result["losses"]
    assert losses[-1] < losses[0] - 0.5, losses

"""Libraries' notices that are not about the run stay out of its log (cluster/library_notices.py):
a ZeRO plan on a machine without a GPU, as on a login node, and an export, through the command
with its output going to a pipe as it does into a Slurm job's log file."""

import subprocess
import sys

from tests.conftest import REPO

NOTICES = ("Setting accelerator to", "torchao", "is an Enum subclass", "srun` command is available", "\r")


def test_a_zero_plan_prints_only_tinytrains_lines(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "tinytrain", "mode=plan", "parallel=zero2", "hardware.gpu=A100", f"hydra.run.dir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert out.startswith("model ") and "deepspeed  ZeRO stage 2" in out
    assert not [n for n in NOTICES if n in out], out[:2000]

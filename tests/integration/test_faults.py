"""Faults that must not lose data: a disk that fills up during a checkpoint save.

(Signals and SIGKILL during a save are in test_resume.py; two runs in one directory in
tests/unit/test_run_directory.py.)
"""

import os

import pytest
import torch

from tests.conftest import mounted_tmpfs, run_cli

pytestmark = pytest.mark.slow

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
# A step checkpoint of this model is 7.2 MB: a 10 MB disk holds step 4's and fills up during step 8's.
RUN = ["experiment=smoke", *MODEL, "data.seq_len=32", "trainer.max_steps=12", "trainer.progress_bar=false", "trainer.export=false", "trainer.plot=false"]


@pytest.fixture
def small_disk(tmp_path):
    """A 10 MB tmpfs (root only)."""
    mount_point = tmp_path / "small_disk"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    with mounted_tmpfs(mount_point, "size=10m"):
        yield mount_point


@pytest.mark.timeout(300)
def test_disk_full_during_a_save_keeps_the_previous_checkpoint_and_says_so(small_disk, tmp_path):
    run_dir = small_disk / "run"
    outside_before = sorted(p.name for p in tmp_path.iterdir())
    r = run_cli(RUN, run_dir)
    assert r.returncode == 3, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "enforce fail" not in r.stderr, r.stderr[-3000:]
    assert f"disk full while saving {run_dir / 'checkpoints' / 'step0000008.ckpt'}; the previous checkpoint step0000004.ckpt is intact" in r.stderr
    assert "resume=auto continues from the newest checkpoint" in r.stderr
    left = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert left == ["step0000004.ckpt"]  # the partial file is gone, the previous one stays
    assert torch.load(run_dir / "checkpoints" / "step0000004.ckpt", weights_only=True)["global_step"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == outside_before

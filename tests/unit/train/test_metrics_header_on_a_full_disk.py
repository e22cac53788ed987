"""metrics.csv's header grows when a new column first appears (val_loss): Lightning rewrote the file
in place, and a full disk there left it empty, every earlier row lost. Written beside it now."""

import contextlib
import os

import pytest

from tests.conftest import mounted_tmpfs
from tinytrain.train.metrics_csv import ContinuedMetrics


def test_a_header_rewrite_that_fills_the_disk_keeps_every_row(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    with mounted_tmpfs(tmp_path, "size=64k"):
        writer = ContinuedMetrics(str(tmp_path), None)
        path = tmp_path / "metrics.csv"
        rows = "".join(f"{step},{8 - step / 10:.4f}\n" for step in range(400))
        path.write_text("step,loss\n" + rows)
        with contextlib.suppress(OSError):
            (tmp_path / "filler").write_bytes(b"x" * 100_000)  # the disk is full now
        with pytest.raises(OSError):
            writer._rewrite_with_new_header(["step", "loss", "val_loss"])
        assert path.read_text() == "step,loss\n" + rows
        assert sorted(p.name for p in tmp_path.iterdir()) == ["filler", "metrics.csv"]

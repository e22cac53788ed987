"""metrics.csv's header grows when a new column first appears (val_loss): Lightning rewrote the file
in place, and a full disk there left it empty, every earlier row lost. Written beside it now."""

import contextlib

import pytest

from tinytrain.train.metrics_csv import ContinuedMetrics


def test_a_header_rewrite_that_fills_the_disk_keeps_every_row(small_disk):
    writer = ContinuedMetrics(str(small_disk), None)
    path = small_disk / "metrics.csv"
    rows = "".join(f"{step},{8 - step / 10:.4f}\n" for step in range(400))
    path.write_text("step,loss\n" + rows)
    with contextlib.suppress(OSError):
        (small_disk / "filler").write_bytes(b"x" * 100_000)  # the disk is full now
    with pytest.raises(OSError):
        writer._rewrite_with_new_header(["step", "loss", "val_loss"])
    assert path.read_text() == "step,loss\n" + rows
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler", "metrics.csv"]

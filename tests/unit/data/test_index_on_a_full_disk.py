"""A sample index written to a full disk (data.cache_dir) leaves no partial temp file: it held on to
the space the user freed for the rerun, and nothing removed it."""

import os

import numpy as np
import pytest

from tests.conftest import mounted_tmpfs
from tinytrain.data.sample_index import _save


def test_a_save_that_fills_the_disk_leaves_nothing(tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    folder = tmp_path / "index"
    folder.mkdir()
    with mounted_tmpfs(folder, "size=64k"):
        with pytest.raises(OSError):  # numpy's "requested and written", or the kernel's ENOSPC
            _save(folder, "train_window_docs.npy", np.zeros(100_000, dtype=np.int64))
        assert list(folder.iterdir()) == []

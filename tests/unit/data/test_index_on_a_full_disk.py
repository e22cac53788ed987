"""A sample index written to a full disk (data.cache_dir) leaves no partial temp file: it held on to
the space the user freed for the rerun, and nothing removed it."""

import numpy as np
import pytest

from tinytrain.data.sample_index import _save


def test_a_save_that_fills_the_disk_leaves_nothing(small_disk):
    with pytest.raises(OSError):  # numpy's "requested and written", or the kernel's ENOSPC
        _save(small_disk, "train_window_docs.npy", np.zeros(100_000, dtype=np.int64))
    assert list(small_disk.iterdir()) == []

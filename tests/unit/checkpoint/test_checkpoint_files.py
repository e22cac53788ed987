"""Checkpoint files: atomic writes that never replace a good checkpoint with a partial one, the
step-checkpoint listing that ignores temp files, pruning to the newest K, folder publication."""

from pathlib import Path

import pytest
import torch

from tinytrain.checkpoint.files import (
    is_temp,
    prune,
    publish_directory,
    step_checkpoint_name,
    step_checkpoints,
    temp_path,
)
from tinytrain.errors import TrainingStopped
from tinytrain.train.atomic_io import AtomicCheckpointIO


def touch(directory, *names):
    for name in names:
        (directory / name).write_bytes(b"x")


def test_listing_is_newest_first_and_ignores_temp_and_other_files(tmp_path):
    touch(tmp_path, "step0000004.ckpt", "step0000012.ckpt", "step0000008.ckpt", "step0000016.ckpt.tmp-123", "final.ckpt", "last_good.ckpt", "step0000020.ckpt.unreadable")
    assert [(s, p.name) for s, p in step_checkpoints(tmp_path)] == [(12, "step0000012.ckpt"), (8, "step0000008.ckpt"), (4, "step0000004.ckpt")]
    assert step_checkpoints(tmp_path / "absent") == []
    assert step_checkpoint_name(40) == "step0000040.ckpt"


def test_prune_keeps_the_newest_k_files_and_folders(tmp_path):
    touch(tmp_path, "step0000004.ckpt", "step0000008.ckpt", "final.ckpt", "step0000016.ckpt.tmp-9")
    (tmp_path / "step0000012.ckpt").mkdir()  # DeepSpeed: a folder of shards
    touch(tmp_path / "step0000012.ckpt", "shard")
    removed = prune(tmp_path, keep_last=2)
    assert sorted(p.name for p in removed) == ["step0000004.ckpt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final.ckpt", "step0000008.ckpt", "step0000012.ckpt", "step0000016.ckpt.tmp-9"]
    prune(tmp_path, keep_last=1)
    assert [p.name for _, p in step_checkpoints(tmp_path)] == ["step0000012.ckpt"]


def test_prune_removes_a_universal_copy_with_its_step_folder(tmp_path):
    for name in ("step0000004.ckpt", "step0000004.universal", "step0000008.ckpt"):
        (tmp_path / name).mkdir()
        touch(tmp_path / name, "shard")
    assert [p.name for p in prune(tmp_path, keep_last=1)] == ["step0000004.ckpt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step0000008.ckpt"]


def test_atomic_save_replaces_the_file_only_when_complete(tmp_path):
    io = AtomicCheckpointIO()
    path = tmp_path / "checkpoints" / "step0000004.ckpt"
    io.save_checkpoint({"global_step": 4, "w": torch.arange(3)}, path)
    assert torch.load(path, weights_only=True)["global_step"] == 4
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temp file left

    class DiskFull(AtomicCheckpointIO):
        def write(self, checkpoint, f):
            f.write(b"partial bytes")
            raise OSError(28, "No space left on device")

    with pytest.raises(TrainingStopped, match="disk full while saving .*step0000004.ckpt; the previous checkpoint step0000004.ckpt is intact"):
        DiskFull().save_checkpoint({"global_step": 8}, path)
    assert torch.load(path, weights_only=True)["global_step"] == 4  # the good one is untouched
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_temp_names_sit_next_to_the_final_name():
    tmp = temp_path(Path("run") / "checkpoints" / "step0000008.ckpt", pid=77)
    assert tmp.parent.name == "checkpoints" and tmp.name == "step0000008.ckpt.tmp-77" and is_temp(tmp)


def test_publish_directory_replaces_an_existing_folder(tmp_path):
    final, tmp = tmp_path / "step0000008.ckpt", tmp_path / "step0000008.ckpt.tmp-5"
    for folder, content in ((final, b"old"), (tmp, b"new")):
        folder.mkdir()
        (folder / "shard").write_bytes(content)
    publish_directory(tmp, final)
    assert (final / "shard").read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["step0000008.ckpt"]


def test_a_temp_a_live_process_writes_is_kept_and_a_gone_one_s_removed(tmp_path):
    """A resumed run removed every temp file in checkpoints/, among them the average a concurrent
    mode=average was writing there (which then failed). Only a writer that is gone (or this
    process, from an earlier attempt) leaves a temp to remove."""
    import os
    import subprocess
    import time

    from tinytrain.checkpoint.resume import leftover_temp_files

    live = subprocess.Popen(["sleep", "60"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        names = {who: f"average-k2-step0000008.ckpt.tmp-{pid}" for who, pid in (("live", live.pid), ("gone", gone.pid), ("self", os.getpid()))}
        touch(tmp_path, *names.values())
        # The live pid's, written an hour before that process started: a reused pid, not its writer.
        reused = tmp_path / f"step0000008.ckpt.tmp-{live.pid}"
        reused.write_bytes(b"half")
        os.utime(reused, (time.time() - 3600, time.time() - 3600))
        removed = leftover_temp_files(tmp_path)
        assert sorted(p.name for p in removed) == sorted([names["gone"], names["self"], reused.name])
        assert [p.name for p in tmp_path.iterdir()] == [names["live"]]
    finally:
        live.kill()
        live.wait()

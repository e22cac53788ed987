"""A half-converted universal checkpoint (a DeepSpeed step folder's conversion for another
data-parallel size, cut short): its temp folder is removed and named in the log, never loaded or
taken for a step checkpoint; a conversion that fails leaves neither a temp nor a final folder.
(Real conversions, saved on 2 ranks and resumed on 1: tests/integration/test_universal_resume.py.)"""

import logging

import pytest

from tinytrain.checkpoint.files import step_checkpoints, universal_path
from tinytrain.checkpoint.resume import leftover_temp_files
from tinytrain.checkpoint.universal import LATEST, convert, is_complete


def step_folder(tmp_path):
    step = tmp_path / "step0000004.ckpt"
    (step / "checkpoint").mkdir(parents=True)
    (step / "latest").write_text("checkpoint")  # Lightning's tag: no optimizer partitions in it
    return step


def half_converted(step, pid: int = 99999):
    """What a rank 0 killed mid-conversion leaves: a temp folder that even holds the tag file."""
    half = universal_path(step).with_name(f"{universal_path(step).name}.tmp-{pid}")
    (half / "checkpoint" / "zero").mkdir(parents=True)
    (half / LATEST).write_text("checkpoint")
    return half


def test_a_half_converted_copy_is_removed_and_named_never_used(tmp_path, caplog):
    step = step_folder(tmp_path)
    half = half_converted(step)
    done = universal_path(step)
    (done / "checkpoint").mkdir(parents=True)
    (done / LATEST).write_text("checkpoint")
    assert [p.name for _, p in step_checkpoints(tmp_path)] == ["step0000004.ckpt"]  # never a resume candidate

    with caplog.at_level(logging.WARNING):
        assert convert(step) == done  # the complete copy, reused (no second conversion)
    assert not half.exists()
    assert f"removing {half.name}: a universal conversion that never finished (never loaded)" in caplog.text


def test_rank_zero_clears_a_half_converted_copy_before_training(tmp_path):
    half = half_converted(step_folder(tmp_path), pid=4242)
    assert leftover_temp_files(tmp_path) == [half] and not half.exists()


def test_a_failed_conversion_leaves_no_folder_behind(tmp_path):
    step = step_folder(tmp_path)
    half = half_converted(step)  # an earlier cut-short conversion too
    with pytest.raises(FileNotFoundError, match="optim_states"):
        convert(step)  # DeepSpeed's converter finds no optimizer partitions
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step0000004.ckpt"]
    assert not half.exists() and not is_complete(universal_path(step))

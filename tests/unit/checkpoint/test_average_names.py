"""An average never replaces an average of other checkpoints that has its name (the run's own
end-of-run average-k3-step0000008 and a mode=average of other steps ending at step 8 share it):
it takes the next free name; an average of the same checkpoints is replaced (checkpoint/average.py)."""

import torch

from tinytrain.checkpoint.average import average_checkpoints, output_path

META = {"true_vocab": 8, "tokenizer_fingerprint": "f", "model": "tiny"}


def checkpoint(path, value: float):
    torch.save({"state_dict": {"model.layer.weight": torch.full((2, 2), value)}, "tinytrain": META, "global_step": 1}, path)
    return path


def no_consolidation(folder, file):
    raise AssertionError("files only")


def test_an_average_of_other_checkpoints_keeps_its_name_and_file(tmp_path):
    s2, s4, s6, s8 = (checkpoint(tmp_path / f"step000000{n}.ckpt", float(n)) for n in (2, 4, 6, 8))
    own = output_path([s4, s6, s8], tmp_path)
    assert own.name == "average-k3-step0000008.ckpt"
    average_checkpoints([s4, s6, s8], own, no_consolidation)
    before = own.read_bytes()

    other = output_path([s2, s4, s8], tmp_path)
    assert other.name == "average-k3-step0000008-2.ckpt"
    average_checkpoints([s2, s4, s8], other, no_consolidation)
    assert own.read_bytes() == before  # the run's own average is untouched
    assert torch.load(other)["state_dict"]["model.layer.weight"][0, 0] == (2 + 4 + 8) / 3

    # The same inputs again go to the file they made (same weights); a third set to the next name.
    assert output_path([s4, s6, s8], tmp_path) == own and output_path([s8, s2, s4], tmp_path) == other
    assert output_path([s2, s6, s8], tmp_path).name == "average-k3-step0000008-3.ckpt"


def test_a_killed_average_s_temp_file_goes_with_the_next_average_and_a_live_one_s_stays(tmp_path):
    """A killed mode=average left a model-sized `<name>.tmp-<pid>` that only a later training start
    in that folder removed (a finished run's, never)."""
    import subprocess

    s4, s8 = (checkpoint(tmp_path / f"step000000{n}.ckpt", float(n)) for n in (4, 8))
    out = output_path([s4, s8], tmp_path)
    live = subprocess.Popen(["sleep", "60"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    try:
        for pid in (live.pid, gone.pid):
            (tmp_path / f"{out.name}.tmp-{pid}").write_bytes(b"half an average")
        average_checkpoints([s4, s8], out, no_consolidation)
        assert sorted(p.name for p in tmp_path.glob("*.tmp-*")) == [f"{out.name}.tmp-{live.pid}"]
    finally:
        live.kill()
        live.wait()
    assert torch.load(out)["state_dict"]["model.layer.weight"][0, 0] == 6


def test_a_folder_the_average_cannot_be_written_to_is_named_before_any_weights_are_read(tmp_path, monkeypatch):
    """It crashed with torch's RuntimeError (not an OSError) after averaging every weight. As root
    (CI) no mode bits refuse a write, so the folder's answer to os.access is what is set here."""
    import os

    import pytest

    from tinytrain.checkpoint.average import resolve_paths
    from tinytrain.errors import ConfigError

    folder = tmp_path / "checkpoints"
    folder.mkdir()
    s4, s8 = (checkpoint(folder / f"step000000{n}.ckpt", float(n)) for n in (4, 8))
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if os.fspath(path) == str(folder) else real(path, mode))
    for listed, last in (([str(s4), str(s8)], None), ([], 2)):  # checkpoints=[...], checkpoint.average_last
        with pytest.raises(ConfigError) as e:
            resolve_paths(listed, last, tmp_path)
        problem = e.value.problems[0]
        assert problem.key == "checkpoint.average" and f"{folder} is not writable" in problem.message and "make that folder writable" in problem.fix

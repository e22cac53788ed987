"""The format table (checkpoint/formats.py) is the one place that knows a checkpoint's on-disk
format: every format has a complete row, no other module decides a format from a path, and a
format added to the table is what resume, pruning and the plan's checks see."""

import ast
import dataclasses
import subprocess
from pathlib import Path

import pytest
import torch

from tinytrain.checkpoint import formats
from tinytrain.checkpoint.files import prune
from tinytrain.checkpoint.formats import FORMATS, CheckpointFormat, FormatRow, format_of, is_checkpoint
from tinytrain.checkpoint.resume import leftover_temp_files, read_state
from tinytrain.errors import ConfigError

PACKAGE = Path(formats.__file__).resolve().parents[1]
OWNERS = {"checkpoint/formats.py"}  # the table (its writers in train/ write one format each, deciding none)
# Recognisers of a format from its path; `.is_dir()` on a checkpoint's path decides one too.
RECOGNISERS = {"is_sharded", "is_deepspeed_folder", "deepspeed_state_file", "DEEPSPEED_STATE_FILES", "is_sharded_folder"}
PATHLIKE = ("path", "ckpt", "checkpoint")


def format_decisions(path: Path) -> list[str]:
    """Recognisers named (imported, called or defined), and `<a checkpoint's path>.is_dir()` (a
    folder of checkpoints, `..._dir`, decides nothing)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name) and node.id in RECOGNISERS or isinstance(node, (ast.FunctionDef, ast.alias)) and node.name in RECOGNISERS:
            found.append(f"line {getattr(node, 'lineno', '?')}: {getattr(node, 'id', None) or node.name}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "is_dir":
            receiver = ast.unparse(node.func.value)
            if any(w in receiver for w in PATHLIKE) and "dir" not in receiver:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_every_format_has_a_complete_row():
    assert set(FORMATS) == set(CheckpointFormat)
    for fmt, row in FORMATS.items():
        assert row.format is fmt
        missing = [f.name for f in dataclasses.fields(FormatRow) if getattr(row, f.name) is None]
        assert missing == [], f"{fmt.value} lacks {missing}"
    assert list(FORMATS)[-1] is CheckpointFormat.file  # the last row takes what no other recognises


def test_no_module_outside_the_table_decides_a_format_from_a_path():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel not in OWNERS and (found := format_decisions(path)):
            offenders[rel] = found
    assert offenders == {}


def test_the_scan_sees_a_decision(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from x import is_sharded\ndef f(ckpt_path, checkpoint_dir):\n    return ckpt_path.is_dir() or is_sharded(ckpt_path) or checkpoint_dir.is_dir()\n")
    assert len(format_decisions(bad)) == 3  # the import, the call, the is_dir (not the folder's)


def test_each_format_is_recognised(tmp_path):
    (tmp_path / "a.ckpt").write_bytes(b"")
    (tmp_path / "sharded.ckpt").mkdir()
    (tmp_path / "sharded.ckpt" / "meta.pt").write_bytes(b"")
    (tmp_path / "ds.ckpt" / "checkpoint").mkdir(parents=True)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text("{}")
    seen = {name: format_of(tmp_path / name).format for name in ("a.ckpt", "sharded.ckpt", "ds.ckpt", "hf", "missing.ckpt")}
    assert seen == {"a.ckpt": CheckpointFormat.file, "sharded.ckpt": CheckpointFormat.sharded, "ds.ckpt": CheckpointFormat.deepspeed, "hf": CheckpointFormat.hf_export, "missing.ckpt": CheckpointFormat.file}
    # What a run can start from: a DeepSpeed folder needs its client state, an export holds none.
    assert [is_checkpoint(tmp_path / n) for n in ("a.ckpt", "ds.ckpt", "hf", "missing.ckpt")] == [True, False, False, False]
    with pytest.raises(ConfigError, match="Hugging Face folder"):
        read_state(tmp_path / "hf")


def test_a_new_format_is_a_row(tmp_path, monkeypatch):
    """A format added to the table alone is what resume, pruning and the plan's checks read."""
    removed = []
    scratch = FormatRow(
        "scratch",
        recognises=lambda p: p.is_dir() and (p / "scratch.json").is_file(),
        complete=lambda p: True,
        training_state=True,
        read_state=lambda p, key: {"global_step": int((p / "scratch.json").read_text())},
        read_weights=lambda p, key, keep_at=None: {"w": torch.zeros(1)},
        saved_layout=lambda p, state: {"format": "file", "strategy": "unknown", "world": 1, "dp": 1, "tp": 1},
        remove=lambda p: removed.append(p.name),
        streams_export=False,
    )
    monkeypatch.setattr(formats, "FORMATS", {"scratch": scratch, **FORMATS})
    for step in (1, 2):
        (tmp_path / f"step{step:07d}.ckpt").mkdir()
        (tmp_path / f"step{step:07d}.ckpt" / "scratch.json").write_text(str(step))
    writer = subprocess.Popen(["true"])  # a save's process that is gone: its temp is left over
    writer.wait()
    dead = writer.pid
    (tmp_path / f"step0000003.ckpt.tmp-{dead}").mkdir()
    (tmp_path / f"step0000003.ckpt.tmp-{dead}" / "scratch.json").write_text("3")
    assert read_state(tmp_path / "step0000002.ckpt") == {"global_step": 2}
    assert is_checkpoint(tmp_path / "step0000001.ckpt")
    prune(tmp_path, keep_last=1)
    leftover_temp_files(tmp_path)
    assert removed == ["step0000001.ckpt", f"step0000003.ckpt.tmp-{dead}"]

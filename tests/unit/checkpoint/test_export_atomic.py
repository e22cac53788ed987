"""Exports are published like checkpoints: a failed or killed export leaves the previous export
whole (or none at all), never a config.json without weights or tokenizer, and the output modes
name what was interrupted."""

from __future__ import annotations

import errno
import hashlib
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, compose
from tinytrain.checkpoint.export import export_state_dict
from tinytrain.checkpoint.export_target import export_dir_problems, export_folder_problems, incomplete, interrupted_exports
from tinytrain.errors import ConfigError

SMALL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]


@pytest.fixture(scope="module")
def tiny(bundled_tokenizer):
    """(state dict, transformers config) of a 2-layer model with the bundled tokenizer's rows."""
    import torch
    from transformers import AutoModelForCausalLM

    from tinytrain.model.build import hf_config

    cfg = compose(SMALL)
    config = hf_config(cfg.model, len(bundled_tokenizer), bundled_tokenizer)
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).state_dict(), config


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_failed_export_leaves_the_previous_export_whole(tiny, bundled_tokenizer, tmp_path, monkeypatch):
    state, config = tiny
    out = tmp_path / "hf_export"
    export_state_dict(dict(state), model_config=config, tokenizer=bundled_tokenizer, true_vocab=len(bundled_tokenizer), out_dir=out)
    before = {p.name: digest(p) for p in out.iterdir() if p.is_file()}

    def disk_full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    # The second export dies after its weights are written, before its tokenizer (a full disk).
    monkeypatch.setattr(type(bundled_tokenizer), "save_pretrained", disk_full)
    doubled = {k: v * 2 for k, v in state.items()}
    with pytest.raises(ConfigError) as e:  # a full disk is named (tests/integration/test_faults.py fills a real one)
        export_state_dict(doubled, model_config=config, tokenizer=bundled_tokenizer, true_vocab=len(bundled_tokenizer), out_dir=out)
    assert "the disk filled up while the export was written" in str(e.value) and "the previous export there is intact" in str(e.value)
    assert {p.name: digest(p) for p in out.iterdir() if p.is_file()} == before
    assert interrupted_exports(out) == [] and incomplete(out) == []


def test_a_second_export_into_the_folder_leaves_the_first_s_temp_and_publishes_only_whole_folders(tiny, bundled_tokenizer, tmp_path):
    """Two exports into one folder (the end of training's and a user's mode=export): the second
    took the first's temp folder for a killed export's and removed it; the first re-created it
    with its tokenizer alone and published that over the second's whole export."""
    from tinytrain.checkpoint.export import export_folder

    state, config = tiny
    out = tmp_path / "hf_export"
    first = subprocess.Popen(["sleep", "60"])  # a live exporter into the same folder
    try:
        writing = tmp_path / f"hf_export.tmp-{first.pid}"
        writing.mkdir()
        (writing / "model.safetensors").write_bytes(b"being written")
        export_state_dict(dict(state), model_config=config, tokenizer=bundled_tokenizer, true_vocab=len(bundled_tokenizer), out_dir=out)
        assert (writing / "model.safetensors").read_bytes() == b"being written" and incomplete(out) == []
    finally:
        first.kill()
        first.wait()
    before = {p.name: digest(p) for p in out.iterdir() if p.is_file()}
    with pytest.raises(ConfigError) as e, export_folder(out) as tmp:
        bundled_tokenizer.save_pretrained(str(tmp))  # its config and weights removed under it: never published
    assert "lacks config.json" in str(e.value) and "so it was not published" in str(e.value)
    assert {p.name: digest(p) for p in out.iterdir() if p.is_file()} == before


def test_a_killed_export_is_never_taken_for_a_finished_one(tiny, tmp_path):
    """SIGKILL in the middle of an export (after the weights, before the tokenizer): nothing at the
    export's path; generate/eval name the leftover; the next export replaces it cleanly."""
    out = tmp_path / "hf_export"
    script = textwrap.dedent(
        f"""
        import os, signal, torch
        from tests.conftest import compose
        from tinytrain.data.tokenizer import load_from_config
        from tinytrain.model.build import hf_config
        from tinytrain.checkpoint.export import export_state_dict
        from transformers import AutoModelForCausalLM
        cfg = compose({SMALL!r})
        tok = load_from_config(cfg.tokenizer)
        config = hf_config(cfg.model, len(tok), tok)
        state = AutoModelForCausalLM.from_config(config).state_dict()
        type(tok).save_pretrained = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)
        export_state_dict(state, model_config=config, tokenizer=tok, true_vocab=len(tok), out_dir={str(out)!r})
        """
    )
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert not out.exists()
    left = interrupted_exports(out)
    assert len(left) == 1 and (left[0] / "model.safetensors").is_file()  # it was killed mid-export
    problems = export_folder_problems("checkpoint.path", out)
    assert "does not exist" in problems[0].message and f"{left[0].name} next to it is an export that was interrupted" in problems[0].message
    state, config = tiny
    from tinytrain.data.tokenizer import load_from_config

    tok = load_from_config(compose(SMALL).tokenizer)
    export_state_dict(dict(state), model_config=config, tokenizer=tok, true_vocab=len(tok), out_dir=out)
    assert incomplete(out) == [] and interrupted_exports(out) == []


def test_an_export_never_replaces_a_folder_that_is_not_an_export(tiny, bundled_tokenizer, tmp_path):
    state, config = tiny
    own = tmp_path / "mine"
    own.mkdir()
    (own / "notes.txt").write_text("keep me\n")
    with pytest.raises(ConfigError) as e:
        export_state_dict(dict(state), model_config=config, tokenizer=bundled_tokenizer, true_vocab=len(bundled_tokenizer), out_dir=own)
    assert "not an export" in e.value.render()
    assert (own / "notes.txt").read_text() == "keep me\n" and not interrupted_exports(own)
    assert export_dir_problems("export.dir", tmp_path / "new") == []


def test_a_folder_with_an_export_s_files_but_no_config_is_named_as_an_incomplete_export(bundled_tokenizer, tmp_path):
    """Read as neither an export (no config.json) nor a checkpoint: generate and eval said it was not
    inside a run's checkpoints/ folder."""
    from tinytrain.outputs import saved_run

    folder = tmp_path / "hf_export"
    bundled_tokenizer.save_pretrained(str(folder))
    with pytest.raises(ConfigError) as e:
        saved_run.load(str(folder), tmp_path)
    problem = e.value.problems[0]
    assert problem.key == "checkpoint.path" and "is not a complete Hugging Face model folder (config.json; " in problem.message and "export it again" in problem.fix

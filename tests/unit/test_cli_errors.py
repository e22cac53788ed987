"""Bad input exits non-zero with one paragraph naming key, value and fix, and no traceback."""

import pytest

from tests.conftest import run_cli

CASES = {
    "unknown group option": (["model=tinylama_1b"], ["model=tinylama_1b", "Did you mean 'tinyllama_1b'", "Available:"]),
    "misspelled key": (["model.hiden_size=128"], ["model.hiden_size", "Did you mean 'hidden_size'"]),
    "wrong type": (["model.hidden_size=big"], ["model.hidden_size", "big", "Integer"]),
    "bad enum value": (["mode=plna"], ["mode=plna", "expected one of [train, plan, prepare, sbatch, export, generate, eval, average, health, doctor]"]),
    "tp not dividing heads": (["mode=plan", "model=qwen2_0_5b", "parallel.tp=4"], ["parallel.tp=4", "tp(4) must divide num_heads(14)"]),
    "missing tokenizer file": (["mode=plan", "tokenizer.path=missing/tokenizer.model"], ["tokenizer.path='missing/tokenizer.model'", "no such file"]),
    "unreadable data path": (["mode=plan", "data=text", "data.path=missing/corpus.txt"], ["data.path='missing/corpus.txt'", "no such file"]),
    "unknown gpu": (["mode=plan", "hardware.gpu=V1000"], ["hardware.gpu='V1000'", "V100"]),
    "bf16 on V100": (["mode=plan", "hardware.gpu=V100", "precision=bf16"], ["V100", "precision=fp16"]),
    "unparsable override": (["tokenizer.add_special_tokens=[<|x|>]"], ["could not parse", "add_special_tokens"]),
    "added unknown key": (["mode=plan", "+lr=1"], ["lr=1", "not a tinytrain config key"]),
    "missing resume checkpoint": (["mode=plan", "resume=missing/step0000040.ckpt"], ["resume='missing/step0000040.ckpt'", "neither auto, never"]),
    # Hydra's own refusals: a traceback, or a key '?' that named nothing.
    "two hydra actions": (["-c", "hydra", "-r"], ["-c (--cfg), -r (--run)", "--resolve has no short form"]),
    "hydra settings resolved alone": (["--cfg", "hydra", "--resolve"], ["--cfg all --resolve", "run.root is not found"]),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_paragraph(name, tmp_path):
    args, needles = CASES[name]
    r = run_cli(args, tmp_path / "run")
    assert r.returncode == 2, r.stderr
    assert "Traceback" not in r.stderr
    assert "Fix:" in r.stderr
    for needle in needles:
        assert needle in r.stderr, (needle, r.stderr)
    assert "HYDRA_FULL_ERROR=1" in r.stderr


def test_hydra_full_error_shows_the_traceback(tmp_path):
    r = run_cli(["mode=plan", "hardware.gpu=V1000"], tmp_path / "run", env={"HYDRA_FULL_ERROR": "1"})
    assert r.returncode != 0 and "Traceback" in r.stderr


@pytest.mark.parametrize("args", [["--help"], ["mode=plan"]])
def test_a_reader_that_leaves_is_not_a_disk_error(args, tmp_path):
    """`tinytrain mode=plan | head -1`: the write to the closed pipe was reported as a file error
    ("failed on a file: Broken pipe. Fix: check the path and the disk"), and --help's as a traceback."""
    import os
    import subprocess
    import sys

    from tests.conftest import REPO, cli_env

    read, write = os.pipe()
    os.close(read)  # the reader is gone before tinytrain writes its first line
    try:
        r = subprocess.run([sys.executable, "-m", "tinytrain", *args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO, env=cli_env(None), stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    assert r.returncode == 141, r.stderr[-2000:]  # as a process SIGPIPE ends
    assert "Traceback" not in r.stderr and "Broken pipe" not in r.stderr and "Error executing job" not in r.stderr, r.stderr

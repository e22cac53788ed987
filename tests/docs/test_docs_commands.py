"""Every `tinytrain` / `python -m tinytrain` command the README and docs/ show runs, so the docs
cannot drift from the code. Commands run in this process (tests/cli_in_process.py), from a
workspace laid out as the docs assume (the repository's examples/ and the shared data beside it):

- a page's set-up blocks (only mkdir and here-documents: files its commands read, as
  docs/evaluation.md's local tasks) run first, in the workspace;
- a training command is planned (`mode=plan` added): what it would train is decided and checked,
  nothing is trained, except `experiment=smoke` runs, which train for real (seconds): the
  README's leaves the run (`runs/<run>`) the export, average, generate and eval commands read;
- `mode=sbatch` writes its script; `mode=export|average|generate|eval` run for real;
- a multirun (`-m`) is planned for its first combination, without the Slurm launcher;
- a command whose comment says `exits N` must exit N (a refusal shown on purpose).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli_in_process import run_in_process
from tests.docs.doc_commands import REPO, DocCommand, doc_commands, setup_blocks

RUN = "docs-run"  # what `<run>` stands for
COMMANDS = doc_commands()
OUTPUT_MODES = {"mode=export", "mode=average", "mode=generate", "mode=eval"}
# Step checkpoints the docs name, made from the smoke run's (its steps are 4 and 8).
NAMED_STEPS = ("step0000200.ckpt", "step0000800.ckpt", "step0000900.ckpt")


def test_the_docs_show_commands_from_every_page():
    pages = {c.where.split(":")[0] for c in COMMANDS}
    assert "README.md" in pages and len(pages) >= 10, pages
    assert len(COMMANDS) >= 25


def runnable(command: DocCommand) -> list[str]:
    """The command as this test runs it: placeholders filled, a training run planned, a multirun's
    first combination without its Slurm launcher."""
    args = [a.replace("<run>", RUN) for a in command.args]
    if "-m" in args:
        args.remove("-m")
        args = [a for a in args if not a.startswith(("hydra/launcher=", "hydra.launcher."))]
        return [a.split(",")[0] if "=" in a and "[" not in a else a for a in args] + ["mode=plan"]
    modes = [a for a in args if a.startswith("mode=")]
    if (not modes or modes == ["mode=train"]) and not args[0].startswith("--") and "experiment=smoke" not in args:
        args = [a for a in args if a != "mode=train"] + ["mode=plan"]
    if args == ["experiment=smoke"]:  # the README's first run: the run the output modes read
        args.append(f"run.name={RUN}")
    return args


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A folder laid out as the docs assume: examples/ of the repository, the shared data at
    ../shared, the files the commands name; the smoke run trained once for the output modes."""
    root = tmp_path_factory.mktemp("docs")
    ws = root / "work"
    ws.mkdir()
    (ws / "examples").symlink_to(REPO / "examples")
    if (REPO.parent / "shared").exists():
        (root / "shared").symlink_to(REPO.parent / "shared")
    shutil.copy(REPO / "tinytrain" / "assets" / "examples" / "preference_tiny.jsonl", ws / "pairs.jsonl")
    for page, block in setup_blocks():
        subprocess.run(["bash", "-e", "-c", block], cwd=ws, check=True, timeout=60)
    (ws / "held_out.txt").write_text("\n\n".join(f"A held-out paragraph number {i} about dictionaries and lists." for i in range(3000)))
    return ws


@pytest.fixture(scope="module")
def smoke_run(workspace):
    """The README's first run, trained for real; the runs the other commands read are made from it."""
    import os

    cwd = os.getcwd()
    os.chdir(workspace)
    try:
        smoke = next(c for c in COMMANDS if "experiment=smoke" in c.args and "-m" not in c.args)
        code, err = run_in_process(runnable(smoke))
    finally:
        os.chdir(cwd)
    assert code == 0, f"{smoke.where}: {smoke.line}\n{err}"
    run = workspace / "runs" / RUN
    for name in NAMED_STEPS:
        shutil.copy(run / "checkpoints" / "step0000008.ckpt", run / "checkpoints" / name)
    shutil.copytree(run / "hf_export", workspace / "models" / "tinyllama")
    chat_model(run / "hf_export", workspace / "models" / "chat")
    return run


def branch_source(workspace: Path, run: Path) -> Path:
    """The anneal example branches off a run called main at its step 60000 (planned, not trained,
    by the command before it): a checkpoint of that name, removed after the command."""
    main = workspace / "runs" / "main"
    (main / "checkpoints").mkdir(parents=True, exist_ok=True)
    shutil.copy(run / "checkpoints" / "step0000008.ckpt", main / "checkpoints" / "step0060000.ckpt")
    return main


def chat_model(export: Path, out: Path) -> None:
    """What an SFT run on ChatML leaves: the export with <|im_start|> and <|im_end|> in its vocab."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(export)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    model = AutoModelForCausalLM.from_pretrained(export)
    model.resize_token_embeddings(len(tokenizer))
    with torch.no_grad():  # trained rows, as SFT leaves them (preflight would rewrite untrained ones)
        for table in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
            table[-2:] = table[100:102]
    tokenizer.save_pretrained(out)
    model.save_pretrained(out)


@pytest.mark.parametrize("command", COMMANDS, ids=[c.where for c in COMMANDS])
def test_a_documented_command_runs(command, workspace, smoke_run, monkeypatch, tmp_path):
    for var in ("HYDRA_FULL_ERROR", "TINYTRAIN_TRACEBACK", "SLURM_JOB_ID", "SLURM_PROCID", "WANDB_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # local files only: a page's command may not need the hub
    monkeypatch.chdir(workspace)
    args = runnable(command)
    if f"run.name={RUN}" in args:  # the smoke run: the fixture trained it, as the page says
        assert (smoke_run / "hf_export" / "config.json").exists() and (smoke_run / "checkpoints" / "final.ckpt").exists()
        return
    made = branch_source(workspace, smoke_run) if "resume=runs/main/checkpoints/step0060000.ckpt" in args else None
    try:
        code, err = run_in_process(args)
    finally:
        if made:
            shutil.rmtree(made)
    assert code == command.expected_exit, f"{command.where}: {command.line}\nran: tinytrain {' '.join(args)}\nexit {code}\n{err[-3000:]}"
    if command.expected_exit:
        reason = command.comment.split(":", 1)[1].strip()
        assert reason in err, f"{command.where}: the page says it exits with {reason!r}; it said:\n{err}"

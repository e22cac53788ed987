"""Sweeps: wandb's own agent runs each launch/ definition's command (planned, offline), and a
local Hydra multirun trains every job, returns its final val_loss and survives a failing job."""

import json
import logging
import os
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, logged, run_cli
from tests.integration.wandb_records import read_run
from tests.sweep_definitions import SWEEP_FILES, agent_command, load, sample


@pytest.mark.parametrize("path", SWEEP_FILES, ids=[p.name for p in SWEEP_FILES])
def test_wandb_agent_runs_the_sweep_command(path, tmp_path, monkeypatch, caplog):
    from wandb.wandb_agent import Agent

    sweep = load(path)
    params = sample(sweep)
    monkeypatch.chdir(REPO)  # where `wandb agent` is started from
    # The agent runs `/usr/bin/env python`: this interpreter, as with the venv activated.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SWEEP_ID", "sweep01")  # `wandb agent` sets it
    monkeypatch.setenv("WANDB_MODE", "offline")
    for key in ("WANDB_RUN_ID", "WANDB_SWEEP_PARAM_PATH"):  # the agent sets these: restored after
        monkeypatch.setenv(key, "")
    # mode=plan and a private run.root as two more parameters: the sweep's own are sampled.
    args = {**params, "mode": "plan", "run.root": str(tmp_path / "runs")}
    agent = Agent(api=None, queue=None, sweep_id="sweep01")
    agent._sweep_command = list(sweep["command"])  # what Agent.run reads from the sweep's config
    agent_log = logging.getLogger("wandb.wandb_agent")  # under "wandb", which does not propagate
    agent_log.addHandler(caplog.handler)
    # Its INFO line gets through whatever logging set-up an earlier test of this worker left
    # (a level above INFO, or a dictConfig that disabled the loggers existing then).
    caplog.set_level(logging.INFO, logger="wandb.wandb_agent")
    monkeypatch.setattr(agent_log, "disabled", False)
    try:
        agent._command_run({"type": "run", "run_id": "run0001", "program": sweep["program"], "args": {k: {"value": v} for k, v in args.items()}})
    finally:
        agent_log.removeHandler(caplog.handler)
    assert agent._run_processes["run0001"].wait(timeout=300) == 0

    # The command line the agent ran is the one tests/sweep_definitions.py builds.
    logged = {r.getMessage() for r in caplog.records if r.getMessage().startswith("About to run command: ")}
    assert logged == {"About to run command: " + " ".join(agent_command(sweep, args))}
    run_dir = tmp_path / "runs" / "sweep-sweep01" / "run0001"
    assert (run_dir / "plan.json").exists()
    resolved = yaml.safe_load((run_dir / "config_resolved.yaml").read_text())
    for key, value in params.items():
        node = resolved
        for part in key.split("."):
            node = node[part]
        assert node == value, (key, node, value)


@pytest.mark.slow
def test_local_multirun_returns_val_loss_and_survives_a_failed_job(tmp_path):
    sweep_dir = tmp_path / "sweep"
    env = {"WANDB_MODE": "offline", "WANDB_API_KEY": "", "WANDB_SILENT": "true"}
    # Job 0 fails validation (lr must be positive); jobs 1 and 2 must still train.
    args = ["-m", "experiment=smoke", "logger=wandb", "trainer.lr=-1,1e-3,3e-3", "trainer.export=false", "trainer.plot=false", "trainer.progress_bar=false", f"hydra.sweep.dir={sweep_dir}"]
    r = run_cli(args, tmp_path / "unused", env=env)
    # After the last job Hydra raises the first failure again: the multirun exits with its code.
    assert r.returncode == 2, r.stderr[-3000:]
    assert "trainer.lr=-1.0: must be positive" in r.stderr and "Traceback" not in r.stderr
    assert "Error executing job with overrides: ['experiment=smoke'" in r.stderr

    failed = json.loads((sweep_dir / "0" / "result.json").read_text())
    assert failed["status"] == "failed" and "trainer.lr" in failed["error"] and failed["val_loss"] is None
    run_ids = set()
    for job, lr in ((1, "0.001"), (2, "0.003")):  # as Hydra writes the swept values
        job_dir = sweep_dir / str(job)
        result = json.loads((job_dir / "result.json").read_text())
        assert result["status"] == "completed" and f"trainer.lr={lr}" in result["overrides"]
        # The job's return value (what a sweeper optimises) is its final validation loss.
        assert result["val_loss"] == pytest.approx(logged(job_dir, "val_loss")[-1], rel=1e-6)
        # Each job has its own wandb run (Lightning would reuse a run left open by the job before).
        runs = list((job_dir / "wandb").glob("offline-run-*/run-*.wandb"))
        assert len(runs) == 1, runs
        config, history = read_run(runs[0])
        assert config["trainer"]["lr"] == float(lr) and config["logger"]["wandb_name"].endswith(f"/{job}")
        assert any("val_loss" in row for row in history)
        run_ids.add(runs[0].name)
    assert len(run_ids) == 2

    # The same multirun in mode=eval scores each job's final checkpoint: its return value (and the
    # list's outcome) is the eval's loss, beside the training's record, which it leaves alone.
    trained = {job: (sweep_dir / str(job) / "result.json").read_text() for job in (0, 1, 2)}
    evals = ["-m", "mode=eval", "checkpoint=final", "experiment=smoke", "trainer.lr=-1,1e-3,3e-3", f"hydra.sweep.dir={sweep_dir}"]
    r = run_cli(evals, tmp_path / "unused", env=env)
    assert r.returncode == 2 and "sweep/0/checkpoints/final.ckpt does not exist" in r.stderr, r.stderr[-3000:]  # job 0 never trained
    listed = [line.split(" - multirun ")[1].split() for line in r.stdout.splitlines() if " - multirun job " in line]  # each job's line as it ends
    for job in (1, 2):
        scored = json.loads((sweep_dir / str(job) / "result-eval.json").read_text())
        assert scored["val_loss"] == json.loads((sweep_dir / str(job) / "eval.json").read_text())["loss"]
        assert ["job", str(job), "eval", "loss", f"{scored['val_loss']:.4f}"] in [row[:5] for row in listed], r.stdout
    assert {job: (sweep_dir / str(job) / "result.json").read_text() for job in (0, 1, 2)} == trained

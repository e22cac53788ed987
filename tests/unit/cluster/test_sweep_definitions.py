"""launch/ sweep definitions: well formed for wandb, every parameter a tinytrain key whose values
compose, build their data and plan, and the agent's command line composes under Hydra with a run directory per run."""

import pytest
from omegaconf import OmegaConf

from tests.conftest import REPO, compose
from tests.sweep_definitions import (
    SWEEP_FILES,
    agent_command,
    edge_values,
    load,
    sample,
    tinytrain_args,
)
from tinytrain.cli import run_stages

AGENT_ENV = {"WANDB_SWEEP_ID": "sweep01", "WANDB_RUN_ID": "run0001"}  # what wandb's agent sets for a run
DISTRIBUTIONS = {"uniform", "log_uniform_values", "int_uniform", "q_uniform", "q_log_uniform_values", "normal", "log_normal"}
IDS = [p.name for p in SWEEP_FILES]


def test_launch_holds_sweep_definitions():
    assert len(SWEEP_FILES) >= 2, SWEEP_FILES


@pytest.mark.parametrize("path", SWEEP_FILES, ids=IDS)
def test_definition_is_well_formed(path):
    sweep = load(path)
    assert sweep["method"] in {"grid", "random", "bayes"}
    assert sweep["metric"] == {"name": "val_loss", "goal": "minimize"}  # the key tinytrain logs
    assert (REPO / sweep["program"]).is_file()
    command = sweep["command"]
    assert command[:4] == ["${env}", "${interpreter}", "-m", "tinytrain"] and command[-1] == "${args_no_hyphens}"
    assert "logger=wandb" in command
    for name, spec in sweep["parameters"].items():
        kinds = [k for k in ("value", "values", "min") if k in spec]
        assert len(kinds) == 1, f"{path.name}: {name} needs one of value, values, min/max"
        if "min" in spec:
            # PyYAML reads 3e-4 (no dot) as a string: write 3.0e-4
            assert all(isinstance(spec[k], (int, float)) for k in ("min", "max")), f"{path.name}: {name} bounds {spec}"
            assert spec["min"] < spec["max"] and spec.get("distribution", "uniform") in DISTRIBUTIONS
            assert sweep["method"] != "grid", f"{path.name}: grid search needs values for {name}"


@pytest.mark.parametrize("path", SWEEP_FILES, ids=IDS)
def test_every_parameter_value_composes_builds_its_data_and_plans(path, monkeypatch, tmp_path):
    for key, value in AGENT_ENV.items():
        monkeypatch.setenv(key, value)
    sweep = load(path)
    for name, spec in sweep["parameters"].items():
        for value in edge_values(spec):
            args = tinytrain_args(agent_command(sweep, {name: value}))
            cfg = compose([*args, "mode=prepare"])
            assert OmegaConf.select(cfg, name) == value, (name, value)
            # Validation, the data (and the batch it must fill), then preflight and the plan.
            run_stages(cfg, tmp_path)
            run_stages(compose([*args, "mode=plan"]), tmp_path)


@pytest.mark.parametrize("path", SWEEP_FILES, ids=IDS)
def test_agent_command_composes_with_a_run_directory_per_wandb_run(path, monkeypatch):
    sweep = load(path)
    params = sample(sweep)
    args = tinytrain_args(agent_command(sweep, params))
    assert args[-len(params) :] == [f"{k}={v}" for k, v in params.items()]  # the sampled values, last
    names = set()
    for run_id in ("run0001", "run0002"):
        monkeypatch.setenv("WANDB_SWEEP_ID", "sweep01")
        monkeypatch.setenv("WANDB_RUN_ID", run_id)
        cfg = compose(args)
        assert {k: OmegaConf.select(cfg, k) for k in params} == params
        assert cfg.logger.wandb
        names.add(cfg.run.name)
    assert names == {"sweep-sweep01/run0001", "sweep-sweep01/run0002"}

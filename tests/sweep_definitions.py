"""launch/ wandb sweep definitions as wandb's agent reads them, and the command line it builds."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.conftest import REPO

SWEEP_FILES = sorted((REPO / "launch").glob("sweep_*.yaml"))


def load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def edge_values(spec: dict) -> list:
    """Values a parameter takes at its edges: its `value`, each of its `values`, or `min` and `max`."""
    if "value" in spec:
        return [spec["value"]]
    if "values" in spec:
        return list(spec["values"])
    return [spec["min"], spec["max"]]


def sample(sweep: dict) -> dict:
    """One parameter set of the sweep: the first edge value of every parameter."""
    return {name: edge_values(spec)[0] for name, spec in sweep["parameters"].items()}


def agent_command(sweep: dict, params: dict) -> list[str]:
    """The command line wandb's agent runs for one parameter set.

    Mirrors wandb 0.31's `wandb_agent.Agent._command_run`: wandb's sweep utilities fill the
    macros (`${args_no_hyphens}` is `key=value` per parameter); `${env}` is /usr/bin/env and
    `${interpreter}` is python. tests/integration/test_sweeps.py checks this against the agent.
    """
    from wandb.sdk.launch.sweeps import utils

    command = utils.create_sweep_command(list(sweep["command"]))
    macros = utils.create_sweep_command_args({"args": {k: {"value": v} for k, v in params.items()}})
    macros.update(env=["/usr/bin/env"], interpreter=["python"], program=[sweep["program"]])
    line = []
    for chunk in map(str, command):
        is_macro = chunk.startswith("${") and chunk.endswith("}")
        line += (macros.get(chunk[2:-1]) or []) if is_macro else [chunk]
    return line


def tinytrain_args(command: list[str]) -> list[str]:
    """The Hydra overrides in an agent command line: everything after `-m tinytrain`."""
    start = command.index("tinytrain")
    assert command[start - 1] == "-m", command
    return command[start + 1 :]

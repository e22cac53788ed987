"""Every `python -m tinytrain ...` command docs/operations.md shows runs on this machine
(in-process: `mode=plan` plans, `mode=doctor` reports), and the plan lines it quotes are the plan's."""

import shlex

import pytest

from tests.conftest import REPO, compose
from tinytrain.plan.run_plan import render

DOC = REPO / "docs" / "operations.md"


def commands() -> list[list[str]]:
    lines = [line.strip() for line in DOC.read_text().splitlines()]
    return [shlex.split(line)[3:] for line in lines if line.startswith("python -m tinytrain ")]


def test_the_page_shows_commands():
    assert len(commands()) >= 3


@pytest.mark.parametrize("args", commands(), ids=" ".join)
def test_each_command_plans(args, tmp_path):
    from tinytrain.cli import run_stages

    if "mode=doctor" in args:
        from tinytrain.outputs import modes

        assert "## distributed variables" in modes.run(compose(args), tmp_path)["report"]
        return
    assert "mode=plan" in args
    plan = run_stages(compose(args), tmp_path).to_dict()
    printed = render(plan)
    assert "watchdog   on:" in printed
    if args == ["mode=plan", "parallel=ddp", "cluster.devices=2"]:  # the lines the page quotes
        quoted = DOC.read_text()
        for line in printed.splitlines():
            if line.startswith(("watchdog", "stragglers")):
                assert line in quoted

"""A plain command composes its config once (tinytrain/config/run_mode.py): Hydra's extra
composition only reads hydra.mode, which no shipped config sets."""

from pathlib import Path

import pytest
import yaml

from tests.cli_in_process import run_in_process
from tests.conftest import CONF_DIR
from tinytrain.config.run_mode import plainly_a_run


def test_no_shipped_config_sets_hydra_mode():
    files = sorted(Path(CONF_DIR).rglob("*.yaml"))
    assert len(files) > 20
    setting = [str(f.relative_to(CONF_DIR)) for f in files if "mode" in ((yaml.safe_load(f.read_text()) or {}).get("hydra") or {})]
    assert not setting, f"{setting} set hydra.mode: run_mode.composed_once would run them once where Hydra might sweep"


@pytest.mark.parametrize(
    ("args", "plain"),
    [
        (["mode=plan", "trainer.lr=1e-3"], True),
        (["-m", "trainer.lr=1e-3,3e-3"], False),
        (["--multirun", "trainer.lr=1e-3,3e-3"], False),
        (["hydra.mode=MULTIRUN", "trainer.lr=1e-3,3e-3"], False),
        (["++hydra.mode=MULTIRUN"], False),
        (["+hydra.searchpath=[file://my_configs]"], False),
        (["--config-dir", "my_configs", "experiment=mine"], False),
        (["-cd=my_configs"], False),
        (["hydra.searchpath=[file://my_configs]"], False),
        (["--multi", "trainer.lr=1e-3,3e-3"], False),  # argparse's abbreviations of Hydra's flags
        (["--config-d", "my_configs", "experiment=mine"], False),
        (["experiment=smoke"], True),
    ],
)
def test_what_counts_as_a_plain_run(args, plain):
    assert plainly_a_run(args) is plain


def test_an_experiment_a_user_added_with_hydra_settings_gets_hydra_s_own_mode(tmp_path, monkeypatch):
    """A sweep's experiment (hydra.mode: MULTIRUN) added to the package's experiments ran once."""
    from tinytrain.config import run_mode

    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "sweep.yaml").write_text("# @package _global_\nhydra:\n  mode: MULTIRUN\n")
    (tmp_path / "experiment" / "plain.yaml").write_text("# @package _global_\ntrainer:\n  lr: 1.0e-3\n")
    (tmp_path / "experiment" / "mine").mkdir()
    (tmp_path / "experiment" / "mine" / "sweep.yaml").write_text("# @package _global_\nhydra:\n  mode: MULTIRUN\n")
    monkeypatch.setattr(run_mode, "CONF_DIR", tmp_path)
    assert not plainly_a_run(["experiment=sweep"]) and plainly_a_run(["experiment=plain"])
    assert not plainly_a_run(["experiment=mine/sweep"])


def test_a_plain_command_composes_once_and_a_multirun_as_hydra_does(tmp_path, monkeypatch):
    from hydra._internal.hydra import Hydra

    calls = []
    original = Hydra.compose_config

    def counted(self, *args, **kwargs):
        calls.append(kwargs.get("run_mode"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Hydra, "compose_config", counted)
    code, err = run_in_process(["mode=plan", f"hydra.run.dir={tmp_path / 'plain'}"])
    assert code == 0, err[-2000:]
    assert len(calls) == 1, calls  # Hydra alone: 2 (get_mode's, then the run's)
    calls.clear()
    code, err = run_in_process(["mode=plan", "hydra.mode=MULTIRUN", "trainer.lr=1e-3,2e-3", f"hydra.sweep.dir={tmp_path / 'sweep'}"])
    assert code == 0, err[-2000:]
    assert len(calls) == 2, calls  # Hydra's get_mode found MULTIRUN, then composed the sweep
    assert len(list((tmp_path / "sweep").glob("*/plan.json"))) == 2  # one job per rate

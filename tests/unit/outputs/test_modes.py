"""The output modes as one table (tinytrain/outputs/modes.py): every Mode is run either by a row of
it or by the cli's training stages, and the cli reaches an output mode only through its row."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tinytrain.config.schema import PLANNING_MODES, Mode
from tinytrain.errors import ConfigError, Problem
from tinytrain.outputs import modes, validate_modes

# The modes the cli runs through its stages (compose, validate, plan, fit) instead of the table.
STAGE_MODES = {Mode.prepare, Mode.train, *PLANNING_MODES}


def test_every_mode_has_exactly_one_home():
    assert set(modes.MODES).isdisjoint(STAGE_MODES)
    assert set(modes.MODES) | STAGE_MODES == set(Mode)


def test_run_dispatches_each_output_mode_to_its_row(monkeypatch, tmp_path: Path):
    calls = []
    monkeypatch.setattr(validate_modes, "problems", lambda cfg, run_dir, data_overridden: [])
    for mode in modes.MODES:
        monkeypatch.setitem(modes.MODES, mode, lambda cfg, run_dir, data_overridden: calls.append((cfg.mode, run_dir, data_overridden)) or {"mode": cfg.mode})
    for mode in list(modes.MODES):
        cfg = OmegaConf.create({"mode": mode})
        assert modes.run(cfg, tmp_path, data_overridden=mode == Mode.eval) == {"mode": mode}
    assert calls == [(m, tmp_path, m == Mode.eval) for m in modes.MODES]


def test_run_validates_before_any_row_runs(monkeypatch, tmp_path: Path):
    monkeypatch.setattr(validate_modes, "problems", lambda cfg, run_dir, data_overridden: [Problem("checkpoint.path", None, "is not set", "name a checkpoint")])
    monkeypatch.setitem(modes.MODES, Mode.export, lambda *a: (_ for _ in ()).throw(AssertionError("row ran before validation")))
    with pytest.raises(ConfigError, match="checkpoint.path"):
        modes.run(OmegaConf.create({"mode": Mode.export}), tmp_path)

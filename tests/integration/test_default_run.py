"""The README's main job: `python -m tinytrain` with no overrides trains to a clearly lower loss."""

import re

import pytest

from tests.conftest import run_cli

pytestmark = [pytest.mark.slow, pytest.mark.longest]


def test_default_run_learns(tmp_path):
    r = run_cli(["trainer.progress_bar=false"], tmp_path / "run", timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    m = re.search(r"loss ([\d.]+) \(first step\) -> ([\d.]+) \(last step\), validation ([\d.]+)", r.stdout)
    assert m, r.stdout[-2000:]
    first, last, val = map(float, m.groups())
    assert first > 7.5  # ~ln(4096) = 8.3 at initialisation
    assert last < first - 2.5 and val < first - 2.0

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
    # A log that is not a terminal gets tinytrain's lines, not libraries' notices about other machines
    # (tinytrain/cluster/library_notices.py): none of these, and no carriage-return progress bars.
    log = r.stdout + r.stderr
    for notice in ("srun` command is available", "Setting accelerator to", "torchao", "is an Enum subclass", "\r"):
        assert notice not in log, (notice, log[-3000:])

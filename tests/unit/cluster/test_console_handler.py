"""stdout's reader leaving early (`| head`) is no error: no "--- Logging error ---" traceback per
line on stderr from Hydra's printing flags (`--info all | head` printed 63)."""

import subprocess
import sys

import pytest

from tests.conftest import REPO, cli_env


@pytest.mark.parametrize("args", [["--info", "all"], ["--i", "all"]], ids=["--info", "abbreviated"])
def test_a_reader_that_leaves_gets_no_tracebacks(args, tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "tinytrain", *args], cwd=tmp_path, env=cli_env({"PYTHONPATH": str(REPO)}), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.readline()
    proc.stdout.close()  # as `head -1` does
    err = proc.stderr.read().decode()
    proc.wait(timeout=120)
    assert "Logging error" not in err and "Traceback" not in err, err[-3000:]

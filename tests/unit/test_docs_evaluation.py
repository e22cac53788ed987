"""docs/evaluation.md's commands run: its first bash block writes the local tasks, and every
`python -m tinytrain ...` it shows plans (mode=plan appended) in the folder that block wrote to."""

from __future__ import annotations

import re
import shlex
import subprocess

from tests.conftest import REPO
from tests.unit.test_bad_inputs import run_in_process

DOC = REPO / "docs" / "evaluation.md"


def test_every_command_of_the_evaluation_page_plans(tmp_path, monkeypatch):
    blocks = re.findall(r"```bash\n(.*?)```", DOC.read_text(), re.S)
    subprocess.run(["bash", "-e", "-c", blocks[0]], cwd=tmp_path, check=True)
    commands = [line for block in blocks[1:] for line in block.splitlines() if line.startswith("python -m tinytrain")]
    assert len(commands) >= 4
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # local tasks only: nothing may need the hub
    for i, command in enumerate(commands):
        args = shlex.split(command)[3:]
        code, err = run_in_process([*args, "mode=plan", f"hydra.run.dir={tmp_path / f'plan{i}'}"])
        assert code == 0, (command, err)

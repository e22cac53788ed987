"""The tests' zygote hands the local ranks Lightning starts to spares forked from rank 0
(tests/zygote.py): each is rank 0's child in its process group, with the command's arguments,
environment, folder and output, and exits as a rank would; a rank whose environment reads otherwise
at import is a fresh process; a spare nobody asked for does not outlive its command."""

import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, ZYGOTE, cli_env

pytestmark = pytest.mark.skipif(os.environ.get("TINYTRAIN_TEST_FRESH_PROCESS") == "1", reason="the zygote is off")


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_spares_become_rank_zeros_children_and_exit_as_ranks(tmp_path):
    spares = 3  # ranks 1 and 2 take one each, rank 3 (another OMP_NUM_THREADS) none: one is left over
    env = cli_env(None)
    # Every test and module gets os.environ back (conftest): a variable differing here leaked from one.
    assert ZYGOTE.serves(env), f"this worker's environment differs from its zygote's in {ZYGOTE.differs(env)}: a test or fixture before this one changed them"
    r = ZYGOTE.run("tests.unit.harness.rank_probe", ["launch", str(tmp_path)], REPO, env, 120, spare_ranks=spares)
    assert r.returncode == 0, r.stderr[-3000:]
    launcher = json.loads((tmp_path / "launcher.json").read_text())
    ranks = {n: json.loads((tmp_path / f"rank{n}.json").read_text()) for n in (1, 2, 3)}
    assert len(launcher["spares"]) == spares
    for n, report in ranks.items():
        assert report["ppid"] == launcher["pid"] and report["pgid"] == launcher["pgid"], (n, report, launcher)
        assert report["local_rank"] == str(n) and report["cwd"] == str(REPO) and report["argv"][-2] == str(n)
        assert launcher["ended"][str(n)]["pid"] == report["pid"]
    assert ranks[1]["preloaded"] and ranks[2]["preloaded"] and not ranks[3]["preloaded"]
    assert {ranks[1]["pid"], ranks[2]["pid"]} < set(launcher["spares"]) and ranks[3]["pid"] not in launcher["spares"]
    assert {n: launcher["ended"][str(n)]["returncode"] for n in (1, 2, 3)} == {1: 7, 2: -9, 3: 0}
    assert all(f"rank {n} says hello" in r.stdout for n in (1, 3))
    left_over = set(launcher["spares"]) - {ranks[1]["pid"], ranks[2]["pid"]}
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in left_over) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in left_over)


def test_the_zygote_keeps_the_sessions_environment_whichever_test_starts_it(monkeypatch):
    """A test that patched a variable read at import (its command gets a fresh interpreter) must not
    start the zygote with it: every later command with the session's environment would go fresh."""
    from tests.zygote import Zygote

    zygote = Zygote()
    session = cli_env(None)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0" if os.environ.get("HF_HUB_OFFLINE") == "1" else "1")
    patched = cli_env(None)
    try:
        assert zygote.differs(patched) == ["HF_HUB_OFFLINE"] and not zygote.serves(patched)
        assert zygote.serves(session)
    finally:
        zygote.close()


def test_what_the_zygotes_imports_set_does_not_send_commands_to_fresh_interpreters(monkeypatch):
    """The worker imported Lightning and torch after the session began (collecting test modules
    does), which set PYTORCH_NVML_BASED_CUDA_CHECK and TORCHINDUCTOR_CACHE_DIR; the zygote's own
    imports set them alike, so a command with them still forks. (Compared with the session's
    environment before the zygote had started, every command of CI went fresh.)"""
    from tests.zygote import Zygote

    monkeypatch.delenv("PYTORCH_NVML_BASED_CUDA_CHECK", raising=False)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    zygote = Zygote()
    monkeypatch.setenv("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_worker")
    try:
        assert zygote.serves(cli_env(None)), zygote.differs(cli_env(None))
    finally:
        zygote.close()


def test_an_in_process_run_leaves_the_environment_as_it_found_it(tmp_path):
    """main() sets HYDRA_FULL_ERROR and TINYTRAIN_TRACEBACK for its child processes, and training sets
    Lightning's seed variables: left in the worker, every later command would miss the zygote."""
    from tests.cli_in_process import run_in_process

    before = dict(os.environ)
    code, err = run_in_process(["mode=plan", f"hydra.run.dir={tmp_path / 'run'}"])
    assert code == 0, err[-2000:]
    assert dict(os.environ) == before

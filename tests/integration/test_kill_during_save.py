"""SIGKILL at each point of a step-checkpoint save, then `resume=auto` in the same run directory:
every checkpoint left loads, and the resumed run's metrics.csv equals an uninterrupted run's row
for row (losses, lr, grad_norm, validation, to the bit on CPU).

The points (tests/integration/instrumented_cli.py, TT_TEST_KILL_AT): before the rename (the temp
file is written, the checkpoint not in place), after the rename (older checkpoints not yet
pruned), after pruning (the save complete, but Lightning has not yet written the step's row:
this lost the row of the checkpoint's step until the row was written before the save).

And a DDP rank killed outright: rank 0 names it and the resume in one line, not gloo's traceback.
"""

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, cli_env, free_port
from tests.integration.test_resume import (
    MODEL,
    batches,
    finish,
    metrics,
    start,
    wait_for,
)
from tinytrain.checkpoint.files import is_temp
from tinytrain.checkpoint.resume import read_state

pytestmark = pytest.mark.slow

# 8 steps, a checkpoint every 2 (the newest 2 kept), validation every 3: the killed step 6 also
# validates, and its checkpoint waits for that validation (a kill between the two lost its row).
RUN = [
    "experiment=smoke",
    *MODEL,
    "data.seq_len=32",
    "trainer.max_steps=8",
    "trainer.log_every_n_steps=1",
    "trainer.checkpoint_every_n_steps=2",
    "trainer.val_every_n_steps=3",
    "checkpoint.keep_last=2",
    "trainer.progress_bar=false",
    "trainer.export=false",
    "trainer.plot=false",
]
KILLED_AT = 6
# What the killed run leaves in checkpoints/, and the step the resumed run continues from.
POINTS = {
    "before_rename": (["step0000002.ckpt", "step0000004.ckpt"], 4),
    "after_rename": (["step0000002.ckpt", "step0000004.ckpt", "step0000006.ckpt"], 6),
    "after_prune": (["step0000004.ckpt", "step0000006.ckpt"], 6),
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run and one killed run per point, all started at once; once every killed
    run has died, what it left is recorded and the resumes start, all at once too."""
    root = tmp_path_factory.mktemp("kill_during_save")
    reference = start(root / "reference", RUN)
    killed = {point: start(root / point, RUN, env={"TT_TEST_KILL_AT": f"{point}:{KILLED_AT}"}) for point in POINTS}
    left = {}
    for point, proc in killed.items():
        out = finish(proc, root / point)
        files = sorted((root / point / "checkpoints").iterdir())
        left[point] = (proc.returncode, out, {p.name: None if is_temp(p) else loads(p) for p in files})
    resumed = {point: start(root / point, RUN) for point in POINTS}
    yield root, reference, left, resumed
    for proc in [reference, *killed.values(), *resumed.values()]:
        proc.kill()


def loads(path) -> tuple[int, bool]:
    """The checkpoint's step, read the way resume reads it, and whether its weights load finite."""
    step = read_state(path)["global_step"]
    full = torch.load(path, weights_only=True)
    return step, all(torch.isfinite(v).all() for v in full["state_dict"].values())


@pytest.mark.timeout(900)
@pytest.mark.parametrize("point", list(POINTS))
def test_sigkill_during_a_save_then_resume_equals_an_uninterrupted_run(point, runs):
    root, reference, left, resumed = runs
    returncode, out, files = left[point]
    assert returncode == -9, out[-3000:]  # killed, by itself, at the point
    expected_left, resumed_from = POINTS[point]
    complete = {name: loaded for name, loaded in files.items() if loaded is not None}
    assert sorted(complete) == expected_left
    assert list(complete.values()) == [(int(name[4:11]), True) for name in sorted(complete)]  # each loads
    assert (len(files) > len(complete)) == (point == "before_rename")  # the unfinished save's temp file

    run_dir = root / point
    out = finish(resumed[point], run_dir)
    assert resumed[point].returncode == 0, out[-3000:]
    assert f"resuming from checkpoints/step{resumed_from:07d}.ckpt (step {resumed_from})" in out

    assert finish(reference, root / "reference") and reference.returncode == 0
    assert metrics(run_dir) == metrics(root / "reference")  # row for row, every logged value as written
    expected = batches(root / "reference")
    assert batches(run_dir) == expected[:KILLED_AT] + expected[resumed_from:]  # steps after the checkpoint trained again
    checkpoints = run_dir / "checkpoints"
    remaining = sorted(p.name for p in checkpoints.iterdir())
    assert remaining == ["final.ckpt", "step0000006.ckpt", "step0000008.ckpt"]  # temp files cleared, pruned to 2
    assert [loads(checkpoints / name) for name in remaining] == [(8, True), (6, True), (8, True)]


def child_ranks(pid: int) -> list[int]:
    """The processes `pid` started that run tinytrain, found by their command line (torchrun starts
    every rank so)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        if int(fields[1]) == pid and b"instrumented_cli" in cmdline:
            found.append(int(stat.parent.name))
    return found


def rank_pids(run_dir: Path) -> dict[int, int]:
    """Each rank's pid, from its watchdog heartbeat."""
    from tinytrain.cluster import heartbeat

    beats = {}
    for attempt in (run_dir / "watchdog").glob("*") if (run_dir / "watchdog").exists() else []:
        beats.update({rank: beat["pid"] for rank, beat in heartbeat.read(attempt).items() if beat})
    return beats


def launched_ranks(pid: int, run_dir: Path) -> dict[int, int]:
    """rank -> pid of the ranks `pid` started as its children (Lightning's launcher starts ranks 1..
    so), found by their heartbeats' pids: a rank the test zygote served keeps the zygote's command line."""
    return {rank: child for rank, child in rank_pids(run_dir).items() if parent_of(child) == pid}


def parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


@pytest.mark.timeout(600)
def test_a_killed_ddp_rank_is_named_by_rank_0_in_one_line(tmp_path):
    run_dir = tmp_path / "run"
    args = [*RUN, "parallel=ddp", "cluster.devices=2", "trainer.max_steps=40"]
    proc = start(run_dir, args)
    wait_for(lambda: len(batches(run_dir)) >= 2 * 3 and 1 in launched_ranks(proc.pid, run_dir), proc, "step 3 on both ranks")
    rank_1 = launched_ranks(proc.pid, run_dir)[1]
    os.kill(rank_1, signal.SIGKILL)
    out = finish(proc, run_dir)
    assert proc.returncode == 3, out[-3000:]
    assert "Traceback" not in out and "Connection closed" not in out and "pair.cc" not in out, out[-3000:]
    lines = [line for line in out.splitlines() if "died" in line]
    assert len(lines) == 1, out[-3000:]
    assert f"tinytrain: rank 1 (pid {rank_1}) died (killed by SIGKILL) during step" in lines[0]
    assert f"Run the same command again with hydra.run.dir={run_dir} (or its run.name): resume=auto continues from checkpoints/step" in lines[0]


def rank_of(pid: int) -> int | None:
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next((int(v[5:]) for v in environ if v.startswith(b"RANK=")), None)


@pytest.mark.timeout(600)
def test_a_rank_killed_under_torchrun_is_explained_by_the_other_in_one_line(tmp_path):
    """torchrun (like srun) starts every rank itself: rank 0 cannot see rank 1 die, only its
    collective fail. It says so in one line, and where to look, instead of gloo's traceback."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    args = [*RUN, "parallel=ddp", "cluster.devices=2", "trainer.max_steps=40", f"hydra.run.dir={run_dir}"]
    env = cli_env({"TT_TEST_BATCH_LOG": str(run_dir / "batches.txt"), "OMP_NUM_THREADS": "1"})
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2", f"--master-port={free_port()}", "--redirects=3", f"--log-dir={tmp_path / 'logs'}"]
    with (run_dir / "out.log").open("w") as out:
        proc = subprocess.Popen([*torchrun, "-m", "tests.integration.instrumented_cli", *args], cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: len(batches(run_dir)) >= 2 * 3 and len(child_ranks(proc.pid)) == 2, proc, "step 3 on both ranks", timeout=400)
        (rank_1,) = [pid for pid in child_ranks(proc.pid) if rank_of(pid) == 1]
        os.kill(rank_1, signal.SIGKILL)
        proc.wait(timeout=300)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # torchrun and whatever it still runs
    rank_0 = next((tmp_path / "logs").rglob("attempt_0/0"))
    rank_0_log = (rank_0 / "stderr.log").read_text() + (rank_0 / "stdout.log").read_text()
    lines = [line for line in rank_0_log.splitlines() if "lost its connection" in line]
    assert len(lines) == 1, rank_0_log[-3000:]
    assert "Traceback" not in rank_0_log and "pair.cc" not in rank_0_log.replace(lines[0], ""), rank_0_log[-3000:]
    assert lines[0].startswith("tinytrain: rank 0 lost its connection to another rank during step")
    assert f"run the same command again with hydra.run.dir={run_dir} (or its run.name): resume=auto continues from checkpoints/step" in lines[0]

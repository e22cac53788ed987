"""The hang watchdog's decisions (tinytrain/cluster/watchdog.py, hang_report.py, heartbeat.py), and
the watchdog process against real stand-in ranks: small Python processes that beat through
cluster/watched_rank.py as a training rank does, without torch. The 2-rank training runs (a rank
frozen with SIGSTOP, a slow checkpoint save, rank 0 killed) are in
tests/integration/test_watchdog.py."""

import contextlib
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO
from tinytrain.cluster import hang_report, heartbeat, watchdog
from tinytrain.cluster.watchdog import stalled

LIMITS = {"startup": 100, "data": 100, "first_step": 50, "compile": 50, "train": 10, "validation": 50, "checkpoint": 60}


def beat(rank, step, phase, seq, host="h", pid=1):
    return {"rank": rank, "pid": pid, "host": host, "step": step, "phase": phase, "seq": seq, "time": 0.0}


def test_a_hang_is_declared_only_when_no_rank_progressed_for_the_slowest_phase_limit():
    seen = {}
    beats = {0: beat(0, 5, "train", 1), 1: beat(1, 5, "train", 1)}
    assert stalled(beats, seen, now=0.0, started=0.0, limits=LIMITS, world=2) is None
    assert stalled(beats, seen, now=10.0, started=0.0, limits=LIMITS, world=2) is None  # at the limit, not past it
    beats[1] = beat(1, 6, "train", 2)  # one rank's progress counts for all
    assert stalled(beats, seen, now=15.0, started=0.0, limits=LIMITS, world=2) is None
    assert stalled(beats, seen, now=25.5, started=0.0, limits=LIMITS, world=2) == "hang:10:10:train"


def test_a_checkpoint_save_on_one_rank_lends_its_limit_to_the_ranks_waiting_for_it():
    seen = {}
    beats = {0: beat(0, 4, "checkpoint", 1), 1: beat(1, 5, "train", 1)}
    assert stalled(beats, seen, now=0.0, started=0.0, limits=LIMITS, world=2) is None
    assert stalled(beats, seen, now=59.0, started=0.0, limits=LIMITS, world=2) is None
    assert stalled(beats, seen, now=61.0, started=0.0, limits=LIMITS, world=2) == "hang:61:60:checkpoint"


def test_ranks_not_yet_beating_are_starting_up_and_finished_ranks_are_not_watched():
    seen = {}
    assert stalled({0: beat(0, 0, "train", 1)}, seen, now=50.0, started=0.0, limits=LIMITS, world=2) is None  # rank 1 still starting
    assert stalled({0: beat(0, 8, "done", 1), 1: beat(1, 8, "done", 1)}, {}, now=1e6, started=0.0, limits=LIMITS, world=2) is None


def test_the_rank_that_did_not_arrive_is_named_by_state_step_or_collective():
    beats = {0: beat(0, 5, "train", 1), 1: beat(1, 5, "train", 1), 2: beat(2, 4, "train", 1), 3: beat(3, 5, "train", 1)}
    states = {0: {"state": "S"}, 1: {"state": "T"}, 2: {"state": "S"}, 3: {"state": "R"}}
    fr = {0: {"seq": 71, "entries": 5}, 1: {"seq": 0, "entries": 0}, 2: {"seq": 70, "entries": 5}, 3: {"seq": 70, "entries": 5}}
    named = hang_report.did_not_arrive(beats, states, fr, world=5)
    assert list(named) == [1, 2, 3, 4]
    assert "stopped" in named[1] and "behind" in named[2] and "collective #70, the others #71" in named[3] and "never wrote" in named[4]
    alike = {r: beat(r, 5, "train", 1) for r in range(2)}
    assert hang_report.did_not_arrive(alike, {0: {"state": "S"}, 1: {"state": "S"}}, {}, world=2) == {}
    # The frozen rank and the one that never started are the causes; ranks behind are waiting on them.
    causes, waiting = hang_report.causes_first(named, states, beats)
    assert list(causes) == [1, 4] and list(waiting) == [2, 3]
    live_only = {2: named[2], 3: named[3]}
    assert hang_report.causes_first(live_only, states, beats) == (live_only, {})


def test_flight_recorder_entries_are_summarized_by_their_newest_collective():
    trace = {"entries": [
        {"collective_seq_id": 70, "profiling_name": "gloo:all_reduce", "process_group": ("0", "default_pg"), "input_sizes": [[4]], "state": "completed"},
        {"collective_seq_id": 71, "profiling_name": "nccl:all_reduce", "process_group": ("0", "default_pg"), "input_sizes": [[336192]], "state": "scheduled"},
    ]}
    summary = hang_report.summarize_fr(trace)
    assert summary["seq"] == 71 and summary["entries"] == 2
    assert summary["last"] == "#71 nccl:all_reduce (process group 0, sizes [[336192]], scheduled)"


def test_a_new_phase_is_written_at_once_steps_when_flushed_and_read_back(tmp_path):
    hb = heartbeat.Heartbeat(tmp_path, rank=3)
    hb.beat(1, "train")
    assert heartbeat.read(tmp_path)[3]["step"] == 1
    hb.beat(2)  # within MIN_INTERVAL_S: counted, not written (a write costs ~0.7 ms on some file systems)
    assert heartbeat.read(tmp_path)[3]["seq"] == 1
    hb.flush()  # the rank's watchdog thread, each second
    assert heartbeat.read(tmp_path)[3]["step"] == 2
    hb.beat(phase="checkpoint")
    assert heartbeat.read(tmp_path)[3] | {"time": 0, "host": "h", "pid": 1, "touched": 0} == beat(3, 2, "checkpoint", 3) | {"touched": 0}


def test_a_rank_beating_on_a_full_disk_is_not_taken_for_a_hung_one(small_disk):
    """Its beats cannot be written, but their mtime still moves (no space needed): the watchdog
    declared a hang of a rank that trained on, and died writing its report on the same disk."""
    hb = heartbeat.Heartbeat(small_disk, rank=0)
    hb.beat(1, "train")
    with contextlib.suppress(OSError):
        (small_disk / "filler").write_bytes(b"x" * 200_000)  # the disk is full now
    seen: dict = {}
    assert watchdog.stalled(heartbeat.read(small_disk), seen, 0.0, 0.0, LIMITS, 1) is None
    time.sleep(0.01)
    hb.beat(phase="validation")  # a new phase is written at once: it fails, its mtime moves
    assert hb.write_failed and heartbeat.read(small_disk)[0]["phase"] == "train"
    assert watchdog.stalled(heartbeat.read(small_disk), seen, 50.0, 0.0, LIMITS, 1) is None  # moved at 50 s
    assert seen[0][1] == 50.0
    assert watchdog.written(small_disk / "hang_report.txt", "x" * 100_000) is False  # said, not a traceback


def test_the_attempt_is_named_by_slurm_or_torchrun_or_made_up_once():
    assert heartbeat.attempt_id({"SLURM_JOB_ID": "12", "SLURM_RESTART_COUNT": "1"}) == "slurm-12-0-1"
    assert heartbeat.attempt_id({"TORCHELASTIC_RUN_ID": "abc"}) == "torchrun-abc-0"
    assert heartbeat.attempt_id({heartbeat.ATTEMPT_VARIABLE: "x"}) == "x"
    assert heartbeat.attempt_id({}) != heartbeat.attempt_id({})


def test_each_process_knows_its_rank_in_the_world_before_any_process_group():
    assert heartbeat.global_rank(8, {"RANK": "13", "LOCAL_RANK": "5", "WORLD_SIZE": "16"}) == 13  # torchrun
    assert heartbeat.global_rank(8, {"SLURM_PROCID": "9", "SLURM_NTASKS": "16"}) == 9  # srun
    assert heartbeat.global_rank(8, {"NODE_RANK": "1", "LOCAL_RANK": "3", "WORLD_SIZE": "16"}) == 11  # Lightning's launcher, second node
    assert heartbeat.global_rank(8, {"NODE_RANK": "1"}) == 8  # the process that launches that node's ranks
    assert heartbeat.global_rank(8, {}) == 0
    assert heartbeat.global_rank(2, {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NAME": "bash", "LOCAL_RANK": "1", "WORLD_SIZE": "2"}) == 1  # srun --pty bash


# A stand-in rank: beats through steps like a training rank, then at `stop_at` gets stuck in a
# Python loop (`spin`) or sleeps; rank/world/limits from argv.
STAND_IN = """
import sys, time
from pathlib import Path
from tinytrain.cluster.watched_rank import WatchedRank

run_dir, rank, world, train_limit, stop_at, how = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
limits = dict.fromkeys(["startup", "data", "first_step", "compile", "validation", "checkpoint"], 60) | {"train": train_limit}
watched = WatchedRank(Path(run_dir), rank, world, limits)

def stuck_in_a_python_loop():
    x = 0
    while True:
        x += 1

for step in range(1, 1000):
    watched.beat(step, "train")
    if step == stop_at:
        stuck_in_a_python_loop() if how == "spin" else time.sleep(600)
    time.sleep(0.1)
"""


def stand_in(run_dir, rank, world, train_limit, stop_at, how="spin"):
    env = {**os.environ, heartbeat.ATTEMPT_VARIABLE: "test"}
    return subprocess.Popen([sys.executable, "-c", STAND_IN, str(run_dir), str(rank), str(world), str(train_limit), str(stop_at), how], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)


@pytest.mark.timeout(60)
def test_a_rank_stuck_in_a_python_loop_is_reported_with_its_stack_and_exits_76(tmp_path):
    rank = stand_in(tmp_path, 0, 1, train_limit=2, stop_at=3)
    try:
        assert rank.wait(timeout=40) == 76
    finally:
        rank.kill()
    report = (tmp_path / "hang_report.txt").read_text()
    assert "no rank made progress for" in report and "(limit 2 s, phase train); step 3" in report
    assert 'in stuck_in_a_python_loop' in report  # faulthandler answered from inside the loop
    assert "no process group yet" in report  # the flight recorder has nothing before rendezvous
    stderr = rank.stderr.read()
    assert "tinytrain: hang: no rank made progress for 2 s (phase train)" in stderr and "exit 76" in stderr
    # Run again in the same attempt's folder (a static torchrun launch names every attempt `none`):
    # the earlier hang's stop file stopped it at once; it trains on to its own hang at step 15.
    again = stand_in(tmp_path, 0, 1, train_limit=2, stop_at=15)
    try:
        assert again.wait(timeout=40) == 76
    finally:
        again.kill()
    assert "(limit 2 s, phase train); step 15" in (tmp_path / "hang_report.txt").read_text()


@pytest.mark.timeout(60)
def test_ranks_stop_soon_after_a_peer_on_their_host_dies(tmp_path):
    """Started side by side (as torchrun or srun start ranks): rank 1 dies (SIGKILL) while rank 0
    sleeps where a collective would wait for it; rank 0 stops well within the hang limit."""
    ranks = [stand_in(tmp_path, 0, 2, train_limit=10, stop_at=3, how="sleep"), stand_in(tmp_path, 1, 2, train_limit=10, stop_at=1000)]
    try:
        deadline = time.monotonic() + 20
        while heartbeat.read(tmp_path / "watchdog" / "test").get(1, {}).get("step", 0) < 3:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        ranks[1].send_signal(signal.SIGKILL)
        started = time.monotonic()
        assert ranks[0].wait(timeout=40) == 76
        assert time.monotonic() - started < 25  # within the hang limit, with room (the grace is 5 s here)
    finally:
        for r in ranks:
            r.kill()
    assert f"rank 1 (pid {ranks[1].pid}) died at step" in ranks[0].stderr.read()
    assert not (tmp_path / "hang_report.txt").exists()  # not a hang: a death, said in one line


def test_a_frozen_rank_that_cannot_exit_is_killed_and_the_status_it_ends_with_is_said(tmp_path, monkeypatch, capsys):
    """A rank frozen by SIGSTOP cannot run the thread that exits 76: it is killed, and the line says
    its status is SIGKILL's (a local run's rank 0 is the command the user ran)."""
    from tinytrain.cluster import watchdog

    monkeypatch.setattr(watchdog, "EXIT_GRACE_S", 0.5)
    frozen = subprocess.Popen(["sleep", "60"])
    try:
        frozen.send_signal(signal.SIGSTOP)
        watchdog.Watchdog(tmp_path, tmp_path, 0, frozen.pid, 1, LIMITS).stop_rank("a hang")
        assert frozen.wait(timeout=10) == -signal.SIGKILL
    finally:
        frozen.kill()
    assert f"tinytrain: rank 0 (pid {frozen.pid}) did not exit within 0.5 s (frozen): killed, so it ends by SIGKILL (exit 137 in a shell), not 76" in capsys.readouterr().err


def ignored(pid: int, sig: signal.Signals) -> bool:
    """Whether process `pid` ignores `sig` (its SigIgn mask in /proc)."""
    mask = next(line for line in open(f"/proc/{pid}/status") if line.startswith("SigIgn:")).split()[1]
    return bool(int(mask, 16) >> (sig - 1) & 1)


def test_slurm_s_sigusr1_to_every_process_leaves_the_watchdog_watching(tmp_path):
    """--signal=USR1@N reaches the watchdog too: its default action killed it, and training went on unwatched."""
    from tinytrain.cluster.watched_rank import WatchedRank

    watched = WatchedRank(tmp_path, 0, 1, dict.fromkeys(["startup", "data", "first_step", "compile", "train", "validation", "checkpoint"], 60))
    try:
        watched.beat(1, "train")
        deadline = time.monotonic() + 30
        while not ignored(watched.process.pid, signal.SIGUSR1):  # once started, it ignores SIGUSR1
            assert watched.process.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        watched.process.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        assert watched.process.poll() is None
    finally:
        watched.finish()
    assert watched.process.wait(timeout=10) == 0


def test_a_finished_rank_s_watchdog_exits(tmp_path):
    """finish() is called however training ends (cli.py): a watchdog left behind would later stop
    the process it watched (a multirun's next job, a test runner)."""
    from tinytrain.cluster.watched_rank import WatchedRank

    watched = WatchedRank(tmp_path, 0, 1, dict.fromkeys(["startup", "data", "first_step", "compile", "train", "validation", "checkpoint"], 60))
    watched.beat(1, "train")
    watched.finish()
    watched.finish()  # twice is harmless (fit's and the cli's)
    assert watched.process.wait(timeout=10) == 0
    assert heartbeat.read(watched.where)[0]["phase"] == "done"


def test_a_hang_verdict_holds_off_lightnings_observer_before_any_rank_is_told_to_exit(tmp_path):
    """Lightning's child-process observer SIGKILLs local rank 0 (exit -9) when a rank it started
    exits first: once the watchdog asks for the flight-recorder dump (a hang verdict, 3 s before any
    stop file), the rank's watch thread stops that observer, so rank 0 too exits 76."""
    import threading

    from tinytrain.cluster.watched_rank import WatchedRank

    done = threading.Event()
    observer = threading.Thread(target=done.wait, name="child-process-observer", daemon=True)
    observer._finished = False  # Lightning's _ChildProcessObserver loops while this is False
    observer.start()
    watched = WatchedRank(tmp_path, 0, 1, dict.fromkeys(["startup", "data", "first_step", "compile", "train", "validation", "checkpoint"], 60))
    try:
        time.sleep(1.5)
        assert observer._finished is False  # no verdict, no hold
        (watched.where / "dump").touch()
        deadline = time.monotonic() + 5
        while not observer._finished and time.monotonic() < deadline:
            time.sleep(0.05)
        assert observer._finished is True
        assert (watched.where / "fr-rank0.json").exists()
    finally:
        watched.finish()
        done.set()
    assert watched.process.wait(timeout=10) == 0


def test_rank_0_clears_the_earlier_attempt_s_files_and_beats_of_ranks_gone_from_this_host(tmp_path):
    """A static torchrun launch reuses its attempt's folder: rank 1's beat of before (a dead pid)
    made rank 0's watchdog stop the run as 'rank 1 died' while the new rank 1 was still starting."""
    import json
    import socket

    from tinytrain.cluster.watched_rank import clear_earlier_attempt

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait(timeout=60)
    beat = {"step": 8, "phase": "train", "seq": 3}
    for rank, pid, host in ((1, gone.pid, socket.gethostname()), (2, os.getpid(), socket.gethostname()), (3, gone.pid, "another-node")):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({**beat, "rank": rank, "pid": pid, "host": host}))
    for name in ("stop-rank0", "claim", "dump", "stop-rank1"):
        (tmp_path / name).write_text("earlier attempt")
    clear_earlier_attempt(tmp_path, 0)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank2.json", "rank3.json", "stop-rank1"]  # rank 1 clears its own


def test_a_held_off_lightning_observer_kills_nothing_when_a_rank_it_started_exits():
    """Lightning's real observer: the flag alone, set while it slept, was overwritten by its next
    look, which SIGKILLed rank 0 (137) once a rank it started had exited 130 (Ctrl-C) or 76."""
    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver

    from tinytrain.cluster.watched_rank import hold_off_lightning_observer

    rank_0 = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # what it would kill
    rank_1 = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(1.5); sys.exit(130)"])
    observer = _ChildProcessObserver(main_pid=rank_0.pid, child_processes=[rank_1], sleep_period=1)
    observer.start()
    try:
        time.sleep(0.3)
        hold_off_lightning_observer()  # while it sleeps, as it nearly always does
        rank_1.wait(timeout=30)
        observer.join(timeout=10)
        assert not observer.is_alive() and rank_0.poll() is None, rank_0.returncode
    finally:
        rank_0.kill()

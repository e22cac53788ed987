"""The hang watchdog: a separate process beside each rank (`python -m tinytrain.cluster.watchdog`,
started by cluster/watched_rank.py), standard library only.

A process and not a thread, because the rank it watches may be unable to run any code: frozen
(SIGSTOP), or holding the GIL in a loop. One per rank, because only a process on the rank's own
host can read its state, ask its stack and stop it; the first watchdog to see a hang writes the
report for all. Each poll it reads every rank's heartbeat and:

- stops quietly when its rank has finished (phase done) or exited;
- stops its rank at once when the process that launched it is gone (Lightning's launcher is rank
  0; torchrun's agent; srun's step daemon): a rank whose launcher died would otherwise sleep in a
  collective until the backend's timeout;
- stops its rank when another rank on this host died without finishing (after a grace, so rank
  0's own one-line explanation of a dead child comes first);
- declares a hang when no rank's heartbeat changed for the limit of the slowest phase any rank is
  in (a checkpoint save on one rank lends its long limit to all: the others wait for it).

On a hang every watchdog asks its rank for its Python stack (SIGUSR2: faulthandler) and its
flight-recorder dump (a file the rank's thread answers), records the rank's process state, and
one of them (the first to create `claim`) writes hang_report.txt. Then each tells its rank to exit
76 (a file its thread watches) and kills it if it cannot (a frozen rank).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import sys
import time
from pathlib import Path

from tinytrain.cluster import hang_report, heartbeat, slurm
from tinytrain.cluster.hang_report import process_state

POLL_S = 1.0
STACK_WAIT_S = 3.0  # for faulthandler and the flight-recorder dump to be written
GATHER_S = 10.0  # for the other ranks' watchdogs (other hosts) to leave their states
EXIT_GRACE_S = 10.0  # for a rank told to exit before it is killed
DEAD_PEER_GRACE_S = 20.0  # rank 0 names a dead local rank itself (train/callbacks/dead_rank.py) within this


class Watchdog:
    def __init__(self, where: Path, run_dir: Path, rank: int, rank_pid: int, world: int, limits: dict[str, int]):
        self.where, self.run_dir, self.rank, self.rank_pid, self.world, self.limits = where, run_dir, rank, rank_pid, world, limits
        self.host = socket.gethostname()
        self.launcher = process_state(rank_pid)["ppid"]
        self.started = time.monotonic()
        self.seen: dict[int, tuple[tuple, float]] = {}  # rank -> ((seq, mtime), when it changed, our clock)
        self.dead_since: dict[int, float] = {}
        self.dead_grace = min(DEAD_PEER_GRACE_S, limits["train"] / 2)

    def poll(self, now: float) -> str | None:
        """What to do now: None (all well), "finished", or why the rank must stop ("hang: ..." for a hang)."""
        state = process_state(self.rank_pid)
        if state["state"] in ("gone", "Z"):
            return "finished"
        beats = heartbeat.read(self.where)
        if beats.get(self.rank, {}).get("phase") == "done":
            return "finished"
        if state["ppid"] is not None and self.launcher is not None and state["ppid"] != self.launcher:
            return f"the process that launched rank {self.rank} (pid {self.launcher}) is gone"
        for rank, beat in beats.items():
            if rank == self.rank or beat["host"] != self.host or beat["phase"] == "done":
                continue
            if process_state(beat["pid"])["state"] in ("gone", "Z"):
                since = self.dead_since.setdefault(rank, now)
                if now - since >= self.dead_grace:
                    return f"rank {rank} (pid {beat['pid']}) died at step {beat['step']} without finishing"
        return stalled(beats, self.seen, now, self.started, self.limits, self.world)

    def run(self) -> int:
        while True:
            verdict = self.poll(time.monotonic())
            if verdict == "finished":
                return 0
            if verdict is not None:
                break
            time.sleep(POLL_S)
        if verdict.startswith("hang"):
            self.on_hang(verdict)
            verdict = f"no rank made progress within the limit; {self.run_dir / REPORT} says where"
        else:
            say(f"tinytrain: stopping rank {self.rank} (pid {self.rank_pid}): {verdict}; exit {EXIT_CODE}")
        self.stop_rank(verdict)
        return 0

    def on_hang(self, verdict: str) -> None:
        state = process_state(self.rank_pid)
        if state["state"] not in hang_report.FROZEN:
            os.kill(self.rank_pid, signal.SIGUSR2)  # faulthandler: every thread's Python stack
        with contextlib.suppress(OSError):  # a read-only disk: the report goes without the collectives
            (self.where / "dump").touch()  # the rank's thread dumps its flight recorder
        time.sleep(STACK_WAIT_S)
        written(self.where / f"state-rank{self.rank}.json", json.dumps(process_state(self.rank_pid)))
        try:
            os.close(os.open(self.where / "claim", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:  # another watchdog writes the report; give it the time to
            wait_until(lambda: (self.run_dir / REPORT).exists(), GATHER_S + 2 * STACK_WAIT_S)
            return
        except OSError:
            pass  # a read-only disk: no claim to take; this watchdog says what it can
        wait_until(lambda: len(list(self.where.glob("state-rank*.json"))) >= self.world, GATHER_S)
        _, seconds, limit, phase = verdict.split(":", 3)
        text = hang_report.render(where=self.where, world=self.world, stalled_s=float(seconds), limit_s=int(limit), limit_phase=phase, beats=heartbeat.read(self.where))
        report = f"every rank's stack and collectives in {self.run_dir / REPORT}" if written(self.run_dir / REPORT, text) else f"{REPORT} could not be written (the disk is full or read-only)"
        named = next(line for line in text.splitlines() if line.startswith("did not arrive"))
        say(f"tinytrain: hang: no rank made progress for {limit} s (phase {phase}); {named}; {report}; exit {EXIT_CODE}")
        job = slurm.job_id()
        if job:
            # The requeue's SIGTERM reaches this process too, as soon as slurmctld takes the requeue:
            # before the line below was written, at times (the test's job log lacked it once).
            with slurm.sigterm_ignored():
                requeued, outcome = slurm.requeue(job)
                say(f"tinytrain: {outcome}" + ("; the requeued job resumes from the newest checkpoint" if requeued else ""))

    def stop_rank(self, why: str) -> None:
        written(self.where / f"stop-rank{self.rank}", why)  # not written: the kill below after the grace
        if not wait_until(lambda: process_state(self.rank_pid)["state"] in ("gone", "Z"), EXIT_GRACE_S):
            os.kill(self.rank_pid, signal.SIGKILL)  # frozen, or its thread could not run
            # Its status is then SIGKILL's, not 76: rank 0 of a local run is the command itself.
            say(f"tinytrain: rank {self.rank} (pid {self.rank_pid}) did not exit within {EXIT_GRACE_S:g} s (frozen): killed, so it ends by SIGKILL (exit 137 in a shell), not {EXIT_CODE}")


EXIT_CODE = 76  # tinytrain.errors.HANG_EXIT_CODE (not imported: this process stays free of the package's imports)
REPORT = "hang_report.txt"


def stalled(beats: dict[int, dict], seen: dict[int, tuple[tuple, float]], now: float, started: float, limits: dict[str, int], world: int) -> str | None:
    """"hang:<seconds>:<limit>:<phase>" when no rank's heartbeat changed for the limit of the slowest
    phase any unfinished rank is in (a rank not yet beating counts as starting up); else None.
    `seen` is updated: rank -> ((seq, file mtime), when we first saw it)."""
    for rank, beat in beats.items():
        mark = (beat["seq"], beat.get("touched"))
        if rank not in seen or seen[rank][0] != mark:
            seen[rank] = (mark, now)
    phases = [b["phase"] for b in beats.values() if b["phase"] != "done"] + ["startup"] * (world - len(beats))
    if not phases:
        return None
    phase = max(phases, key=lambda p: limits[p])
    last = max([started, *(when for _, when in seen.values())])
    if now - last > limits[phase]:
        return f"hang:{now - last:.0f}:{limits[phase]}:{phase}"
    return None


def written(path: Path, text: str) -> bool:
    """hang_report.write, False where the disk is full or read-only (a traceback here ended the
    watchdog, and the run went on unwatched)."""
    try:
        hang_report.write(path, text)
        return True
    except OSError:
        return False


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--folder", type=Path, required=True)
    parser.add_argument("--run-dir", type=Path, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--pid", type=int, required=True)
    parser.add_argument("--world", type=int, required=True)
    parser.add_argument("--limits", type=json.loads, required=True)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the rank's to handle; this ends with it
    # Slurm's --signal=USR1@N reaches every process of the job: its default action killed the
    # watchdog, and a rank already hung then was never reported or requeued.
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    return Watchdog(args.folder, args.run_dir, args.rank, args.pid, args.world, args.limits).run()


if __name__ == "__main__":
    sys.exit(main())

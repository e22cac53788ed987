"""Heartbeats: each rank's progress, readable from outside the rank (cluster/watchdog.py reads them).

A rank writes <run dir>/watchdog/<attempt>/rank<N>.json: its pid, host, step, phase and a counter
that grows with every beat. The watchdog judges progress by that counter changing, on its own
clock, so clocks that differ between nodes do not matter. Writes are atomic (a reader never sees
half a file), and cost: a write is ~0.7 ms on some file systems, a step can be tens of ms. A new
phase is written at once (its limit applies from its start); steps at most once per
MIN_INTERVAL_S, and the rank's watchdog thread (cluster/watched_rank.py) flushes what is unwritten
every second, so a rank that stops shows the step it stopped in. Standard library only:
the watchdog process imports this without torch.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from pathlib import Path

from tinytrain.cluster import rank_logging

log = logging.getLogger(__name__)

# Every phase a rank can be in; plan/watchdog.py gives each its limit. "done": finished, not watched.
PHASES = ("startup", "data", "first_step", "compile", "train", "validation", "evals", "checkpoint", "done")
MIN_INTERVAL_S = 0.5
ATTEMPT_VARIABLE = "TINYTRAIN_WATCH_ATTEMPT"


def attempt_id(env=os.environ) -> str:
    """One id per start of the job, the same on every rank: the ranks of one attempt write into one
    folder, and a requeued or rerun job's watchdog does not read the previous attempt's beats.
    Slurm and torchrun name the attempt; otherwise rank 0 makes one up and the ranks Lightning's
    launcher starts inherit it through the environment."""
    if env.get(ATTEMPT_VARIABLE):
        return env[ATTEMPT_VARIABLE]
    if env.get("SLURM_JOB_ID"):
        return f"slurm-{env['SLURM_JOB_ID']}-{env.get('SLURM_STEP_ID', '0')}-{env.get('SLURM_RESTART_COUNT', '0')}"
    if env.get("TORCHELASTIC_RUN_ID"):
        return f"torchrun-{env['TORCHELASTIC_RUN_ID']}-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:8]}"


def global_rank(devices_per_node: int, env=os.environ) -> int:
    """This process's rank in the world, before any process group: torchrun and srun say it
    (RANK, SLURM_PROCID); Lightning's own launcher says only LOCAL_RANK (absent in the process it
    starts from) and the node's NODE_RANK."""
    said = rank_logging.launcher_rank(env)
    if said and said[0] != "LOCAL_RANK":
        return said[1]
    return int(env.get("NODE_RANK", 0)) * devices_per_node + (said[1] if said else 0)


def folder(run_dir: Path, attempt: str) -> Path:
    return Path(run_dir) / "watchdog" / attempt


class Heartbeat:
    def __init__(self, where: Path, rank: int):
        self.path = where / f"rank{rank}.json"
        self.rank, self.pid, self.host = rank, os.getpid(), socket.gethostname()
        self.step, self.phase, self.seq = 0, "startup", 0
        self.written_at, self.written_seq = 0.0, -1
        self.lock = threading.Lock()  # the training thread and the flushing thread both write
        self.write_failed = False  # said once

    def beat(self, step: int | None = None, phase: str | None = None) -> None:
        self.seq += 1
        changed = phase is not None and phase != self.phase
        if step is not None:
            self.step = step
        if phase is not None:
            self.phase = phase
        now = time.monotonic()
        if changed or now - self.written_at >= MIN_INTERVAL_S:
            self.write(now)

    def flush(self) -> None:
        """Write what the throttle held back (from another thread)."""
        if self.seq != self.written_seq:
            self.write()

    def write(self, now: float | None = None) -> None:
        with self.lock:
            self.written_at = time.monotonic() if now is None else now
            record = {"rank": self.rank, "pid": self.pid, "host": self.host, "step": self.step, "phase": self.phase, "seq": self.seq, "time": time.time()}
            self.written_seq = record["seq"]
            temp = self.path.with_name(self.path.name + ".tmp")
            try:
                temp.write_text(json.dumps(record))
                os.replace(temp, self.path)
            except OSError as e:
                # A full disk (or a run folder gone): the run's own save names it; a beat not written
                # must not end this rank with a traceback of its own. The next beat tries again.
                self.written_seq = -1
                try:
                    # Progress still shows: a new mtime needs no space (the watchdog reads it beside
                    # seq), so a rank training on a full disk is not taken for a hung one.
                    os.utime(self.path)
                    self.written_seq = record["seq"]  # not retried by flush() until the rank moves on
                except OSError:
                    pass
                if not self.write_failed:
                    log.warning("heartbeat %s not written (%s): the hang watchdog sees this rank's older beat until one is", self.path, e.strerror or e)
                self.write_failed = True


def read(where: Path) -> dict[int, dict]:
    """Every rank's newest beat, by rank."""
    beats = {}
    for path in where.glob("rank*.json"):
        try:
            record = json.loads(path.read_text())
            record["touched"] = path.stat().st_mtime_ns  # a beat on a full disk: the mtime alone moves
        except (OSError, ValueError):
            continue  # replaced while read: the next poll reads it
        beats[record["rank"]] = record
    return beats

"""The rank's side of the hang watchdog (cluster/watchdog.py): its heartbeat, its stack on request,
its flight-recorder dump on request, and its exit when its watchdog says so.

- faulthandler writes every thread's Python stack to stack-rank<N>.txt on SIGUSR2, from C, so it
  answers while the main thread waits in a collective or spins in a Python loop.
- PyTorch's flight recorder keeps the last collectives of every process group (gloo and NCCL) when
  TORCH_FR_BUFFER_SIZE (TORCH_NCCL_TRACE_BUFFER_SIZE for older torch) is set before the process
  group is made: set here, before training. Only the rank's own process can read it, so a thread
  dumps it when the watchdog asks.
- The same thread writes the heartbeat's held-back beats each second (cluster/heartbeat.py), and
  ends the process with exit 76 when the watchdog writes stop-rank<N>: a signal
  handler would run only once the main thread is back in Python, which a rank in a collective is not.
"""

from __future__ import annotations

import contextlib
import faulthandler
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from tinytrain.cluster import hang_report, heartbeat
from tinytrain.cluster.local_process import running
from tinytrain.errors import HANG_EXIT_CODE

STACK_SIGNAL = signal.SIGUSR2  # SIGUSR1 is Slurm's warning (callbacks/preemption.py)
FLIGHT_RECORDER_ENTRIES = "2000"  # torchtitan's default; a few hundred bytes each
POLL_S = 1.0


class WatchedRank:
    def __init__(self, run_dir: Path, rank: int, world: int, limits: dict[str, int]):
        attempt = heartbeat.attempt_id()
        os.environ[heartbeat.ATTEMPT_VARIABLE] = attempt  # the ranks Lightning's launcher starts share it
        self.where = heartbeat.folder(run_dir, attempt)
        self.where.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        clear_earlier_attempt(self.where, rank)
        os.environ.setdefault(flight_recorder_variable(), FLIGHT_RECORDER_ENTRIES)
        self.stacks = (self.where / f"stack-rank{rank}.txt").open("w")
        faulthandler.register(STACK_SIGNAL, file=self.stacks, all_threads=True, chain=False)
        self.heartbeat = heartbeat.Heartbeat(self.where, rank)
        self.heartbeat.write()
        args = ["--folder", str(self.where), "--run-dir", str(run_dir), "--rank", str(rank), "--pid", str(os.getpid()), "--world", str(world), "--limits", json.dumps(limits)]
        # Not a child that dies with the rank: it must see the rank frozen. It exits when the rank does.
        self.process = subprocess.Popen([sys.executable, "-m", "tinytrain.cluster.watchdog", *args], stdin=subprocess.DEVNULL)
        self.finished = threading.Event()
        threading.Thread(target=self._listen, name="tinytrain-hang-watch", daemon=True).start()

    def beat(self, step: int | None = None, phase: str | None = None) -> None:
        self.heartbeat.beat(step, phase)

    def finish(self) -> None:
        """Training is over on this rank: its watchdog stops (the export after it is not watched)."""
        if self.finished.is_set():
            return
        self.heartbeat.beat(phase="done")
        self.finished.set()
        faulthandler.unregister(STACK_SIGNAL)
        self.stacks.close()

    def _listen(self) -> None:
        dumped = False
        stop = self.where / f"stop-rank{self.rank}"
        while not self.finished.wait(POLL_S):
            self.heartbeat.flush()
            if not dumped and (self.where / "dump").exists():  # a hang verdict: stop files follow in >= 3 s
                dumped = True
                hold_off_lightning_observer()
                with contextlib.suppress(OSError):  # a full disk: the report goes without this rank's collectives
                    hang_report.write(self.where / f"fr-rank{self.rank}.json", json.dumps(flight_recorder()))
            if stop.exists():
                print(f"tinytrain: rank {self.rank} stopped by its watchdog: {stop.read_text()} (exit {HANG_EXIT_CODE})", file=sys.stderr, flush=True)
                self.stacks.flush()
                os._exit(HANG_EXIT_CODE)


def clear_earlier_attempt(where: Path, rank: int) -> None:
    """A static torchrun launch names every attempt `none` (its --rdzv-id's default): a relaunch
    found the hang's stop-rank<N> of the one before and exited 76 at once, every time. Each rank
    removes its own files before its watchdog starts; rank 0 the shared ones too (a hang of this
    attempt writes them only after its limit)."""
    names = [f"stop-rank{rank}", f"state-rank{rank}.json", f"fr-rank{rank}.json"] + (["claim", "dump"] if rank == 0 else [])
    if rank == 0:  # another rank's beat of before, from a process of this host no longer running: "died"
        names += [f"rank{r}.json" for r, beat in heartbeat.read(where).items() if r != 0 and beat.get("host") == socket.gethostname() and not running(int(beat.get("pid", 0)))]
    for name in names:
        with contextlib.suppress(OSError):
            (where / name).unlink()


def hold_off_lightning_observer() -> None:
    """On local rank 0, Lightning's child-process observer SIGKILLs this process (exit -9) within 5 s
    of seeing a rank it started exit non-zero. Once a hang verdict is reached every rank exits 76
    and rank 0 must too (a Slurm job requeues on it), and a rank that died needs rank 0's one-line
    message (train/callbacks/dead_rank.py): either way this process ends the run itself."""
    for thread in threading.enumerate():
        if thread.name == "child-process-observer":
            # It loops `while not _finished: sleep; _finished = _run()`: a flag set while it sleeps
            # is overwritten by the next _run, which kills. With no children to look at, that run
            # finds all well and ends the loop. Rebound, not cleared: the list is the launcher's
            # procs, which DeadRank reads.
            thread._child_processes = []
            thread._finished = True


def flight_recorder() -> dict:
    """The summary hang_report.py shows of this rank's flight recorder (torch's _dump_fr_trace)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.distributed.is_available() or not torch.distributed.is_initialized():
        return {"seq": 0, "entries": 0, "last": "", "note": "no process group yet (before rendezvous)"}
    import pickle

    c10d = torch._C._distributed_c10d
    dump = getattr(c10d, "_dump_fr_trace", None) or getattr(c10d, "_dump_nccl_trace", None)
    if dump is None:
        return {"seq": 0, "entries": 0, "last": "", "note": f"not recorded: torch {torch.__version__} has no flight recorder for this backend"}
    started = time.monotonic()
    trace = pickle.loads(dump(True, False, False))
    summary = hang_report.summarize_fr(trace)
    summary["note"] = f"dumped in {time.monotonic() - started:.2f} s"
    return summary


def flight_recorder_variable() -> str:
    """TORCH_FR_BUFFER_SIZE (torch >= 2.7); older torch reads TORCH_NCCL_TRACE_BUFFER_SIZE, which
    newer torch still reads but warns about on every rank."""
    from importlib.metadata import version

    major, minor = (int(p) for p in version("torch").split(".")[:2])
    return "TORCH_FR_BUFFER_SIZE" if (major, minor) >= (2, 7) else "TORCH_NCCL_TRACE_BUFFER_SIZE"

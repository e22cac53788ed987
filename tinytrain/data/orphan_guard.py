"""Worker processes end when their parent dies, by any signal, and leave stop signals to it.

A spawned tokenizer worker blocks on its task pipe, which its siblings keep open: when the parent
is killed (SIGKILL, or SIGTERM, which Python does not turn into an exception) nothing would ever
close it, and the workers would wait for ever. On Linux the kernel sends the worker SIGKILL when
its parent exits (prctl PR_SET_PDEATHSIG); everywhere, a watchdog thread also checks the parent
pid each second. Standard library only: tokenize_worker.py imports it in fresh processes.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

PR_SET_PDEATHSIG = 1  # linux/prctl.h
POLL_SECONDS = 1.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


@contextmanager
def stop_signals_held():
    """Start workers inside: they inherit the stop signals blocked (through fork and exec), so the
    group's signal in the moment before leave_stop_signals_to runs in them waits there instead of
    killing them (a validation's fresh DataLoader workers died so: exit 1, no checkpoint). This
    thread gets a signal that came meanwhile when the block ends."""
    if not hasattr(signal, "pthread_sigmask"):
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def die_with_parent(parent_pid: int) -> None:
    """Call first thing in a worker; `parent_pid`: the pid of the process that started it."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):
            pass  # no prctl: the watchdog alone
    leave_stop_signals_to(parent_pid)
    # The parent may have died before prctl took effect: then no signal will come.
    if os.getppid() != parent_pid:
        os._exit(1)
    threading.Thread(target=_watch, args=(parent_pid,), name="tinytrain-orphan-guard", daemon=True).start()


def leave_stop_signals_to(parent_pid: int) -> None:
    """Stop signals are the parent's to act on (a checkpoint at the step boundary, exit 75): Slurm
    and a terminal signal the whole process group, and a DataLoader worker killed by SIGTERM made
    torch raise mid-step in the parent instead. The worker ends with its parent, and still on a
    SIGTERM from the parent itself (torch's DataLoader terminates a worker that will not exit)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if not hasattr(signal, "sigwaitinfo"):  # not Linux: the group's SIGTERM keeps its default
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
        return
    # Started under stop_signals_held: ignored now, so they may arrive (one pending is discarded).
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGUSR1})
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # threads started later inherit it

    def from_parent_only() -> None:
        while True:
            if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent_pid:
                os._exit(0)

    threading.Thread(target=from_parent_only, name="tinytrain-stop-signals", daemon=True).start()


def _watch(parent_pid: int) -> None:
    while True:
        time.sleep(POLL_SECONDS)
        if os.getppid() != parent_pid:
            os._exit(1)


def dataloader_worker_init(parent_pid: int, worker_id: int) -> None:
    """DataLoader's worker_init_fn (bound to the parent's pid with functools.partial)."""
    die_with_parent(parent_pid)

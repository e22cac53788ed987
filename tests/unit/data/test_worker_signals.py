"""A worker leaves stop signals to its parent (data/orphan_guard.py): the SIGTERM Slurm or a shell
sends the whole process group does not end it (it made torch raise mid-step in the trainer), while
its parent's own SIGTERM (torch's DataLoader terminating a worker that will not exit) still does."""

import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

WORKER = "import os, sys, time; from tinytrain.data.orphan_guard import die_with_parent; die_with_parent(os.getppid()); print('ready', flush=True); time.sleep(60)"


def started():
    worker = subprocess.Popen([sys.executable, "-c", WORKER], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert worker.stdout.readline().strip() == "ready"
    return worker


def test_the_group_s_stop_signals_are_left_to_the_parent_and_the_parent_s_sigterm_ends_it():
    worker = started()
    try:
        for sig in ("TERM", "INT", "USR1"):  # from another process, as the group's are
            subprocess.run(["kill", f"-{sig}", str(worker.pid)], check=True)
        time.sleep(0.5)
        assert worker.poll() is None
        worker.send_signal(signal.SIGTERM)  # from its parent, this process
        assert worker.wait(timeout=10) == 0
    finally:
        worker.kill()
        worker.wait()


@pytest.mark.parametrize("sig", ["TERM", "INT", "USR1"])
def test_a_stop_signal_before_the_worker_s_init_waits_for_it(sig, monkeypatch):
    """A validation starts fresh workers: the group's SIGTERM between a worker's fork and its
    worker_init_fn killed it, and torch raised "DataLoader worker exited unexpectedly" mid-run."""
    import multiprocessing

    from tinytrain.data import orphan_guard, worker_loader

    def slow_guard(parent_pid, worker_id):  # torch's own worker setup runs first: widened to 1 s here
        time.sleep(1.0)
        orphan_guard.dataloader_worker_init(parent_pid, worker_id)

    monkeypatch.setattr(worker_loader, "dataloader_worker_init", slow_guard)
    loader = worker_loader.WorkerSafeDataLoader(list(range(8)), batch_size=2, num_workers=1)
    before = {p.pid for p in multiprocessing.active_children()}
    batches = iter(loader)
    (worker,) = [p for p in multiprocessing.active_children() if p.pid not in before]
    subprocess.run(["kill", f"-{sig}", str(worker.pid)], check=True)  # from another process, as the group's are
    assert [b.tolist() for b in batches] == [[0, 1], [2, 3], [4, 5], [6, 7]]

"""A worker leaves stop signals to its parent (data/orphan_guard.py): the SIGTERM Slurm or a shell
sends the whole process group does not end it (it made torch raise mid-step in the trainer), while
its parent's own SIGTERM (torch's DataLoader terminating a worker that will not exit) still does."""

import signal
import subprocess
import sys
import time

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

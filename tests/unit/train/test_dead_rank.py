"""Rank 0's reading of a local rank that ended first (train/callbacks/dead_rank.py), on real child
processes: one stopped by the hang watchdog makes rank 0 stop as a hang (exit 76, so a Slurm job
requeues), not as a failed rank (exit 3), which a 4-rank run with one rank frozen showed."""

import subprocess
import sys
from types import SimpleNamespace

from tinytrain.errors import HANG_EXIT_CODE
from tinytrain.train.callbacks.dead_rank import DeadRank


def ended_child(code: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({code})"])
    proc.wait(timeout=60)
    return proc


def trainer_with(procs) -> SimpleNamespace:
    return SimpleNamespace(strategy=SimpleNamespace(launcher=SimpleNamespace(procs=procs)), global_step=5, world_size=len(procs) + 1, global_rank=0)


def test_a_rank_stopped_by_the_hang_watchdog_stops_rank_0_as_a_hang(tmp_path):
    callback = DeadRank(tmp_path)
    callback.on_exception(trainer_with([ended_child(0), ended_child(HANG_EXIT_CODE)]), None, RuntimeError("Connection closed by peer"))
    assert callback.hang
    assert "rank 2 (pid " in callback.message and f"was stopped by the hang watchdog during step 6 (exit {HANG_EXIT_CODE})" in callback.message
    assert "hang_report.txt says which rank did not arrive" in callback.message


def test_a_rank_that_failed_is_named_as_failed_not_as_a_hang(tmp_path):
    callback = DeadRank(tmp_path)
    callback.on_exception(trainer_with([ended_child(1)]), None, RuntimeError("Connection closed by peer"))
    assert not callback.hang and "rank 1 (pid " in callback.message and "failed (exit status 1) during step 6" in callback.message


def test_a_taken_rendezvous_port_is_a_refusal_not_a_lost_rank(tmp_path, monkeypatch):
    """MASTER_PORT held by another run: rank 0 said it lost a rank during step 1 (exit 3)."""
    import socket

    import torch.distributed as dist

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        monkeypatch.setenv("MASTER_PORT", str(port))
        try:  # torch's own error for it, as the rendezvous raises it
            dist.TCPStore("127.0.0.1", port, 1, True, use_libuv=True)
        except dist.DistNetworkError as e:
            taken = e
    callback = DeadRank(tmp_path)
    waiting = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # a rank it started
    callback.on_exception(trainer_with([waiting]), None, taken)
    assert waiting.wait(timeout=30) != 0  # not left waiting for the rendezvous
    assert callback.message is None and callback.refusal.key == "MASTER_PORT" and callback.refusal.value == str(port)
    assert "unset MASTER_PORT" in callback.refusal.render()
    # Not the user's: Lightning's, from the Slurm job id, or a free port it picked.
    from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment

    monkeypatch.delenv("MASTER_PORT")
    lightnings = DeadRank(tmp_path)
    monkeypatch.setenv("MASTER_PORT", str(port))
    in_job = trainer_with([])
    in_job.strategy.cluster_environment = SLURMEnvironment()
    lightnings.on_exception(in_job, None, taken)
    assert "from the Slurm job id" in lightnings.refusal.render() and "export MASTER_PORT=<a free port> in the job script" in lightnings.refusal.render()
    local = trainer_with([])
    local.strategy.cluster_environment = LightningEnvironment()  # an interactive allocation's too, SLURM_JOB_ID or not
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    lightnings.on_exception(local, None, taken)
    assert "(a free port Lightning picked)" in lightnings.refusal.render()

"""Stop signals as a cluster and a terminal send them: to the whole process group (DataLoader
workers included), before training starts (Slurm's SIGUSR1 whenever its warning falls due), twice
(Ctrl-C again), and at a step that validates. Each stops the way docs/checkpoints.md says."""

import os
import signal
import time

import pytest

from tests.conftest import metrics_rows, start_cli
from tinytrain.checkpoint.resume import read_state

pytestmark = pytest.mark.slow

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
RUN = ["experiment=smoke", *MODEL, "data.seq_len=32", "trainer.max_steps=40", "trainer.log_every_n_steps=1", "trainer.progress_bar=false", "trainer.export=false", "trainer.plot=false"]


def start(run_dir, args, env=None, new_session=False):
    return start_cli(args, run_dir, {"TT_TEST_BATCH_LOG": str(run_dir / "batches.txt"), "OMP_NUM_THREADS": "1", **(env or {})}, module="tests.integration.instrumented_cli", new_session=new_session)


def wait_for(condition, proc, what: str, timeout=180):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def steps_trained(run_dir) -> int:
    path = run_dir / "batches.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def finish(proc, run_dir) -> str:
    proc.wait(timeout=300)
    return (run_dir / "out.log").read_text()


@pytest.mark.timeout(300)
def test_sigterm_to_the_process_group_with_dataloader_workers_saves_and_exits_75(tmp_path):
    """scancel and the time limit signal every process: a worker killed by SIGTERM made torch raise
    mid-step in the trainer (exit 1, no checkpoint)."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, [*RUN, "data.num_workers=2"], new_session=True)
    wait_for(lambda: steps_trained(run_dir) >= 3, proc, "step 3")
    os.killpg(proc.pid, signal.SIGTERM)
    out = finish(proc, run_dir)
    assert proc.returncode == 75, out[-3000:]
    assert "SIGTERM at step" in out and "DataLoader worker" not in out


@pytest.mark.timeout(300)
def test_sigusr1_before_training_is_honoured_at_the_first_step(tmp_path):
    """Slurm's warning before the time limit can fall during the plan or the data build: its default
    action killed the process there (exit 138), no checkpoint, no requeue."""
    run_dir = tmp_path / "run"
    proc = start(run_dir, RUN)
    wait_for(lambda: (run_dir / "plan.json").exists(), proc, "the plan")  # planned, training not started
    assert steps_trained(run_dir) == 0
    proc.send_signal(signal.SIGUSR1)
    out = finish(proc, run_dir)
    assert proc.returncode == 75, out[-3000:]
    assert "SIGUSR1 at step 1: checkpoint saved to checkpoints/step0000001.ckpt" in out


@pytest.mark.timeout(300)
def test_ctrl_c_again_during_the_save_stops_at_once_with_130(tmp_path):
    """Lightning turned the second Ctrl-C's KeyboardInterrupt into exit 1, with no word of it."""
    run_dir, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    proc = start(run_dir, RUN, env={"TT_TEST_SLOW_SAVE": "5"})
    wait_for(lambda: steps_trained(run_dir) >= 3, proc, "step 3")
    proc.send_signal(signal.SIGINT)
    wait_for(lambda: list(checkpoints.glob("step*.ckpt.tmp-*")), proc, "the Ctrl-C save")
    proc.send_signal(signal.SIGINT)
    out = finish(proc, run_dir)
    assert proc.returncode == 130, out[-3000:]
    assert "interrupted (Ctrl-C)" in out
    assert not list(checkpoints.glob("step*.ckpt"))  # the save did not finish: no checkpoint in its place


@pytest.mark.timeout(300)
def test_a_signal_at_a_validating_step_saves_after_the_validation(tmp_path):
    """The stop's checkpoint was written before the step's validation: a process killed during that
    validation left a checkpoint whose step's val_loss row the resumed run never writes."""
    run_dir = tmp_path / "run"
    # Every step validates (its checkpoint waits for it); the signal arrives during step 3 at the latest.
    proc = start(run_dir, [*RUN, "trainer.val_every_n_steps=1", "trainer.val_batches=1"])
    wait_for(lambda: steps_trained(run_dir) >= 2, proc, "step 2")
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, run_dir)
    assert proc.returncode == 75, out[-3000:]
    step = int(out.split("SIGTERM at step ")[1].split(":")[0])
    rows = {int(r["step"]) + 1: r for r in metrics_rows(run_dir) if r.get("val_loss")}  # Lightning's step + 1: the step trained
    assert step in rows, (step, sorted(rows))
    # Saved after the step's validation: its loops count that validation's batch (step - 1 before).
    ckpt = read_state(run_dir / "checkpoints" / f"step{step:07d}.ckpt")
    assert ckpt["loops"]["fit_loop"]["epoch_loop.val_loop.batch_progress"]["total"]["completed"] == step

"""tinytrain jobs on the test Slurm: the environment they run in, a small CPU run, and their outputs."""

from __future__ import annotations

import csv
import os
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO
from tests.slurm_cluster import FINISHED, Job, SlurmCluster

BUNDLED_TOKENIZER = REPO / "tinytrain" / "assets" / "bundled_tokenizer"
# Two tasks on the CPU with a core each: the node's GPUs and 64 CPUs exist for the scheduler only,
# and a task with the scripts' 8 threads would fight the others for the machine's cores.
CPU_TASKS = ["--ntasks-per-node=2", "--cpus-per-task=1"]
# A run of seconds: tiny windows, a validation and a checkpoint halfway, every step logged.
SHORT_RUN = [
    "trainer.max_steps=6",
    "trainer.warmup_steps=1",
    "trainer.micro_batch_size=2",
    "trainer.global_batch_size=null",
    "data.seq_len=64",
    "trainer.log_every_n_steps=1",
    "trainer.val_every_n_steps=3",
    "trainer.val_batches=1",
    "trainer.checkpoint_every_n_steps=3",
    "trainer.progress_bar=false",
    "trainer.plot=false",
    "trainer.export=false",
]
# For a SIGUSR1 mid-run: it goes out when the first periodic checkpoint (step 5) appears, and 55
# more steps leave it time to arrive mid-run on a fast machine too.
REQUEUE_STEPS = 60
REQUEUE_RUN = [*SHORT_RUN, f"trainer.max_steps={REQUEUE_STEPS}", "trainer.checkpoint_every_n_steps=5", "trainer.val_every_n_steps=10"]


def job_env() -> dict:
    """What a job needs from the test: the test's Python first on PATH (the scripts call
    `python`) and this checkout importable. sbatch passes the submitting environment on."""
    return {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(REPO),
    }


@dataclass
class Finished:
    job: Job
    log: str
    run_dir: Path

    def losses(self) -> dict[int, float]:
        with (self.run_dir / "metrics.csv").open() as f:
            return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f) if r.get("loss")}


def submit(slurm: SlurmCluster, script: Path, options: list[str], args: list[str], out_dir: Path) -> int:
    """Submit a script from the repo root (as the README says) with its log and run directory in
    out_dir; returns the job id. The run is named by the job (slurm-<job id>), as on a cluster."""
    options = [f"--output={out_dir}/%x-%j.out", *options]
    return slurm.sbatch(script, options, [*args, f"run.root={out_dir}"], env=job_env(), cwd=REPO)


def finish(slurm: SlurmCluster, job_id: int, out_dir: Path, timeout: float = 300, run_dir: Path | None = None) -> Finished:
    """Waits for the job; it must have completed. Its run directory: run_dir, else run.name's default."""
    job = slurm.wait(job_id, timeout)
    log_path = Path(job.fields["StdOut"])
    log = log_path.read_text(errors="replace") if log_path.exists() else f"(no log at {log_path})"
    assert job.state == "COMPLETED", f"job {job_id} ended {job.state} ({job.fields.get('ExitCode')}):\n{log[-6000:]}"
    return Finished(job, log, run_dir or out_dir / f"slurm-{job_id}")


def wait_for(condition, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {what} after {timeout:.0f} s")
        time.sleep(0.2)


@dataclass
class Requeued:
    resumed: Finished  # the job sent SIGUSR1, after its second start
    uninterrupted: Finished  # the same job submitted again and left alone
    first: str  # the resumed job's log of its first start ...
    second: str  # ... and of its second


def requeue_mid_run(slurm: SlurmCluster, script: Path, options: list[str], args: list[str], out_dir: Path) -> Requeued:
    """Submits REQUEUE_RUN (+ args) twice at once, on the same nodes: one job gets SIGUSR1 (to srun's
    tasks, as --signal=USR1@N would send it; the batch shell does not get it) once its first
    periodic checkpoint exists, and must be requeued once and complete; the other runs
    uninterrupted. --exclusive=user lets the two share nodes (the scripts' --exclusive would run
    one after the other), and so do options that ask for a GPU per task, not the scripts' 8."""
    interrupted, reference = out_dir / "interrupted", out_dir / "reference"
    interrupted.mkdir(), reference.mkdir()
    options = [*options, "--exclusive=user"]
    job_id = submit(slurm, script, options, [*REQUEUE_RUN, *args], interrupted)
    reference_id = submit(slurm, script, options, [*REQUEUE_RUN, *args], reference)
    checkpoints = interrupted / f"slurm-{job_id}" / "checkpoints"  # run.name from the job id, kept across the requeue
    wait_for(lambda: any(checkpoints.glob("step*.ckpt")) or slurm.job(job_id).state in FINISHED, 180, f"periodic checkpoint in {checkpoints}")
    assert slurm.job(job_id).state == "RUNNING", f"job {job_id} ended before its first checkpoint: {slurm.job(job_id).fields.get('StdOut')}"
    slurm.run(["scancel", "--signal=USR1", str(job_id)])

    # A requeued job is PENDING, then RUNNING again, until its second start ends; one the signal
    # missed ends at once.
    resumed = finish(slurm, job_id, interrupted, timeout=400)
    assert resumed.job.restarts == 1, resumed.log[-4000:]
    first, _, second = resumed.log.partition("restart 1,")  # the scripts' banner per start
    assert "restart 0," in first and second, resumed.log[-4000:]
    return Requeued(resumed, finish(slurm, reference_id, reference), first, second)


def assert_resumed_on_the_same_trajectory(requeued: Requeued) -> None:
    """It resumed from a checkpoint written after the signal came (after the first periodic one)
    and trained every step as the uninterrupted run did."""
    resumed_from = re.search(r"resuming from checkpoints/step\d+\.ckpt \(step (\d+)\)", requeued.second)
    assert resumed_from and int(resumed_from.group(1)) >= 5, requeued.second[-4000:]
    losses, expected = requeued.resumed.losses(), requeued.uninterrupted.losses()
    assert sorted(losses) == sorted(expected) == list(range(REQUEUE_STEPS)), f"steps logged: {sorted(losses)}"
    assert [losses[s] for s in range(REQUEUE_STEPS)] == [expected[s] for s in range(REQUEUE_STEPS)]

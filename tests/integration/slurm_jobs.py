"""tinytrain jobs on the test Slurm: the environment they run in, a small CPU run, and their outputs."""

from __future__ import annotations

import csv
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import REPO
from tests.slurm_cluster import Job, SlurmCluster

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

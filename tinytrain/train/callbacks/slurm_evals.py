"""eval.where=slurm: rank 0 submits a one-GPU Slurm job for each checkpoint the plan names once it
is on disk (cluster/eval_jobs.py), and for the final weights; the job exports and scores it and
appends to evals.csv. Training never waits: a submission is one sbatch call, a job's state is
asked (scontrol) only when the next one is submitted and at the end, a job that failed or could not
be submitted is logged and changes nothing else.
"""

from __future__ import annotations

import logging
from pathlib import Path

import lightning.pytorch as pl

from tinytrain.checkpoint.files import step_checkpoint_name
from tinytrain.cluster import eval_jobs
from tinytrain.train import evals_csv

log = logging.getLogger(__name__)
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")


class SlurmEvals(pl.Callback):
    def __init__(self, plan, cfg, run_dir: Path, max_steps: int):
        self.evals = plan
        self.cfg = cfg
        self.run_dir = Path(run_dir)
        self.max_steps = max_steps
        self.waiting: list[int] = []  # steps to submit once their checkpoint is published
        self.jobs: dict[str, int] = {}  # job id -> step
        self.states: dict[str, str] = {}
        self.refused: dict[int, str] = {}  # step -> why sbatch refused it
        self.done: set[int] = set()  # steps scored already or queued

    def on_train_start(self, trainer, pl_module):
        if trainer.is_global_zero:
            self.done = evals_csv.scored_steps(self.run_dir / "evals.csv")  # a resumed run's scored steps

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if trainer.is_global_zero and step not in self.done and step != self.max_steps and self.evals.scores_at(step, self.max_steps):
            self.done.add(step)  # once: under gradient accumulation this runs for every micro batch
            self.waiting.append(step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.is_global_zero and self.waiting:
            self.submit_published()

    def on_train_end(self, trainer, pl_module):
        if trainer.is_global_zero:
            self.submit_published()

    def submit_published(self) -> None:
        for step in list(self.waiting):
            if (self.run_dir / "checkpoints" / step_checkpoint_name(step)).exists():
                self.waiting.remove(step)
                self.submit(step)

    def submit_final(self, step: int) -> None:
        """The final weights (fit.py calls this on rank 0 once final.ckpt is saved)."""
        if step not in self.done:
            self.done.add(step)
            self.submit(step)

    def submit(self, step: int) -> None:
        self.poll()
        folder = self.run_dir / eval_jobs.FOLDER
        folder.mkdir(parents=True, exist_ok=True)
        script = folder / f"step{step:07d}.sbatch"
        script.write_text(eval_jobs.render(self.cfg, run_dir=self.run_dir.resolve(), step=step, workdir=Path.cwd().resolve()))
        job, why = eval_jobs.submit(script)
        if job is None:
            self.refused[step] = why
            log.warning("eval job for step %d not submitted (training goes on): %s", step, why)
            return
        self.jobs[job] = step
        log.info("eval job %s submitted for step %d (%s)", job, step, script)

    def poll(self) -> None:
        for job, step in self.jobs.items():
            if self.states.get(job) in ENDED:
                continue
            state = eval_jobs.state(job)
            if state in ENDED and state != "COMPLETED":
                log.warning("eval job %s for step %d ended %s (training goes on); its log: %s", job, step, state, self.run_dir / eval_jobs.FOLDER)
            self.states[job] = state

    def summary(self) -> str:
        self.poll()
        counts: dict[str, list[int]] = {}
        for job, step in self.jobs.items():
            counts.setdefault(self.states.get(job, "UNKNOWN"), []).append(step)
        parts = [f"{state.lower()} {', '.join(map(str, sorted(steps)))}" for state, steps in sorted(counts.items())]
        parts += [f"not submitted {step} ({why})" for step, why in sorted(self.refused.items())]
        return f"eval jobs: {len(self.jobs)} submitted (steps: {'; '.join(parts) or 'none'}); their scores are appended to evals.csv as they arrive, their logs in {self.run_dir / eval_jobs.FOLDER}"


def slurm_eval_callback(plan, cfg, run_dir: Path) -> list:
    if plan.evals is None or plan.evals.where != "slurm":
        return []
    return [SlurmEvals(plan.evals, cfg, run_dir, plan.max_steps)]

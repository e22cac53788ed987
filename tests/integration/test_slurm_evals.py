"""eval.where=slurm on the test Slurm cluster: a local training run submits one eval job per saved
checkpoint and one for the final weights; training does not wait for them; each job scores its
checkpoint and appends to evals.csv; a job that fails (its checkpoint was pruned by
checkpoint.keep_last=1 before it started) is reported, and training is unaffected."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli
from tests.integration.test_evals import LIMIT, MODEL, OFFLINE, TASKS, read_evals, write_tasks

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_one_job_per_checkpoint_results_collected_and_a_failure_reported(slurm, tmp_path):
    tasks_dir, run_dir = tmp_path / "tasks", tmp_path / "run"
    write_tasks(tasks_dir)
    env = slurm.env(OFFLINE)
    args = ["experiment=smoke", *MODEL, "trainer.progress_bar=false", "trainer.max_steps=4", "trainer.checkpoint_every_n_steps=2", "trainer.val_every_n_steps=4", "checkpoint.keep_last=1", "cluster.time=10"]
    args += [f"eval.tasks=[{','.join(TASKS)}]", f"eval.include=[{tasks_dir}]", f"eval.limit={LIMIT}", "eval.where=slurm"]
    r = run_cli(args, run_dir, env=env)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert "a one-GPU Slurm job per checkpoint" in r.stdout
    assert "eval jobs: 2 submitted" in r.stdout, r.stdout[-1500:]
    jobs = [j for j in slurm.wait_all(timeout=300) if j.fields.get("JobName", "").endswith("-eval")]  # the session's cluster ran other tests' jobs too
    states = sorted(j.state for j in jobs)
    assert states == ["COMPLETED", "FAILED"], (states, [(p.name, p.read_text()[-1500:]) for p in (run_dir / "eval_jobs").glob("*.out")])
    assert (run_dir / "eval_jobs" / "step0000002.failed").is_file()  # step 2 was pruned before its job read it
    rows = read_evals(run_dir)
    assert {int(x["step"]) for x in rows} == {4} and {x["task"] for x in rows} == set(TASKS)
    # mode=eval on the run reports the failed job and finds nothing left to score.
    again = run_cli(["mode=eval", f"checkpoint.path={run_dir}"], tmp_path / "backfill", env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "eval job for step 2 failed (exit 2, job" in again.stdout
    assert "1 of 1 checkpoints already in evals.csv; scoring none" in again.stdout

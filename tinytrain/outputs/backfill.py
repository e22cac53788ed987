"""mode=eval on a run folder (checkpoint.path=<run dir>): every checkpoint of the run not yet scored
on all the tasks in its evals.csv is exported and scored by lm-eval's own hf model, oldest first.

Idempotent: a step with rows for every task is not scored again, so a second run computes nothing.
Each checkpoint's rows are appended at once (train/evals_csv.py): killed midway, the next run
starts from the first checkpoint still missing. The tasks are eval.tasks (with eval.include and
eval.limit) as given, else the run's own.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tinytrain.checkpoint.files import step_checkpoints
from tinytrain.checkpoint.resume import read_state
from tinytrain.data.batch_ramp import BatchRamp
from tinytrain.errors import ConfigError, Problem
from tinytrain.outputs import saved_run
from tinytrain.plan import eval_tasks
from tinytrain.plan.layout import BatchPlan
from tinytrain.train import evals_csv


def is_run_folder(run: Path) -> bool:
    """A run's folder (its checkpoints and saved config), which no checkpoint format is."""
    checkpoints_dir = run / "checkpoints"
    return run.is_dir() and checkpoints_dir.is_dir() and (run / saved_run.RUN_CONFIG).is_file()


def run_checkpoints(run: Path) -> list[tuple[int, Path]]:
    """(step, checkpoint) of the run, oldest first: its step checkpoints and final.ckpt (unless a
    step checkpoint holds the same step)."""
    found = {step: path for step, path in step_checkpoints(run / "checkpoints")}
    final = run / "checkpoints" / "final.ckpt"
    if final.exists():
        found.setdefault(int(read_state(final, saved_run.KEY).get("global_step", 0)), final)
    return sorted(found.items())


def eval_settings(cfg, run: Path):
    """eval.* as given when it names tasks, else the run's own."""
    return cfg.eval if cfg.eval.tasks else saved_run.run_config(run / saved_run.RUN_CONFIG).eval


def inherited_code_problems(cfg, run: Path) -> list[Problem]:
    """The run's own eval.include, taken when the command names no tasks, may hold Python that
    lm-eval imports to build and score its tasks: from a run copied from elsewhere that ran on
    `mode=eval checkpoint.path=<run>`. It runs only when this command names those folders too
    (as the run's Slurm eval jobs do)."""
    if cfg.eval.tasks:
        return []
    saved = eval_settings(cfg, run)
    named = {str(folder) for folder in cfg.eval.include}
    code = eval_tasks.task_code(tuple(f for f in saved.include if str(f) not in named))
    if not code:
        return []
    return [
        Problem(
            "eval.include",
            list(saved.include),
            f"the run's saved eval.include holds Python that lm-eval imports to build its tasks ({', '.join(code[:3])}{', ...' if len(code) > 3 else ''}); "
            "tinytrain runs a folder's code only when the command names the folder",
            f"read that code, then name the folders on this command: eval.include=[{','.join(saved.include)}]",
        )
    ]


def ev_step(cfg) -> int | None:
    return cfg.eval.step


def problems(cfg, run: Path) -> list[Problem]:
    found = []
    step = ev_step(cfg)
    if step is not None and step not in dict(run_checkpoints(run)):
        found.append(Problem("eval.step", step, f"the run {run} holds no checkpoint of that step (it has {', '.join(str(s) for s, _ in run_checkpoints(run)) or 'none'}; step checkpoints beyond checkpoint.keep_last are deleted)", "name a step it holds, or leave eval.step=null to score every checkpoint not yet scored"))
    if not eval_settings(cfg, run).tasks:
        found.append(Problem("eval.tasks", [], f"scoring the run {run} needs downstream tasks, and neither eval.tasks nor the run's config names any", "add eval.tasks=[<lm-eval task>,...] (eval.include=[<folder>] for local ones)"))
    if not run_checkpoints(run):
        found.append(Problem(saved_run.KEY, str(run), "holds no checkpoint to score (no checkpoints/step<N>.ckpt, no final.ckpt)", "train the run first (trainer.checkpoint_every_n_steps sets how often it saves), or name a run that saved checkpoints"))
    if not os.access(run, os.W_OK | os.X_OK):  # evals.csv and its lock go there: said before the first scoring
        found.append(Problem(saved_run.KEY, str(run), "is not writable, and the scores are appended to its evals.csv", "make the run folder writable, or copy the run elsewhere and score the copy"))
    return found


def tokens_at(run: Path, step: int, checkpoint: Path | None = None) -> int | str:
    """Tokens seen by `step`: as the checkpoint recorded them (train/callbacks/tokens_seen.py, counted
    across resumes under other batches), else counted as the inline scoring counts them
    (plan/layout.py's tokens_over, from the run's plan.json; a batch warm-up's ramp is rebuilt with
    the run's trainer.batch_size_warmup.tokens). '' without either."""
    if checkpoint is not None:
        from tinytrain.train.callbacks.tokens_seen import STATE_KEY  # here: Lightning is not a planning import

        recorded = read_state(checkpoint, saved_run.KEY).get("callbacks", {}).get(STATE_KEY, {})
        if recorded.get("step") == step:
            return int(recorded["tokens"])
    plan = json.loads((run / "plan.json").read_text()) if (run / "plan.json").is_file() else {}
    if not plan.get("batch"):
        return ""
    b, r = plan["batch"], plan.get("batch_size_warmup")
    ramp = r and BatchRamp.over_tokens(r["start"], r["final"], r["increment"], saved_run.run_config(run / saved_run.RUN_CONFIG).trainer.batch_size_warmup.tokens, b["seq_len"])
    return BatchPlan(b["micro_batch_size"], b["accumulate_grad_batches"], plan["parallel"]["dp"], b["global_batch_size"], b["seq_len"], ramp or None).tokens_over(step)


def backfill(cfg, run: Path, out_dir: Path, score) -> dict:
    """Score each checkpoint missing from run/evals.csv with `score(cfg, ev, saved, out_dir)` ->
    lm-eval's results; append its rows; plot."""
    from tinytrain.cluster import eval_jobs
    from tinytrain.plan import eval_tasks
    from tinytrain.train.plot import plot_evals

    ev = eval_settings(cfg, run)
    csv_path = run / "evals.csv"
    checkpoints = run_checkpoints(run)
    leaves = {t.name for t in eval_tasks.resolve(tuple(ev.tasks), tuple(ev.include)).leaves}
    scored = evals_csv.scored_tasks(csv_path)
    done = {step for step, tasks in scored.items() if leaves <= tasks}
    todo = [(step, path) for step, path in checkpoints if step not in done and ev_step(cfg) in (None, step)]
    for step, why, folder in eval_jobs.failures(run):
        print(f"eval job for step {step} failed ({why}); its log is in {folder}", flush=True)
    print(f"evals of {run}: {already_line(checkpoints, done, ev_step(cfg))}; scoring {', '.join(f'step {s}' for s, _ in todo) or 'none'} on {', '.join(ev.tasks)}", flush=True)
    scored_now = []
    for step, path in todo:
        try:
            saved = saved_run.load(str(path), out_dir, cfg.model.trust_remote_code)
            tokens = tokens_at(run, step, path)  # before scoring: the checkpoint may be pruned meanwhile
            rows = evals_csv.rows_of(score(cfg, ev, saved, out_dir), step, tokens)
        except (ConfigError, OSError):
            if path.exists():
                raise
            # A run still training prunes its step checkpoints (checkpoint.keep_last) while they are scored.
            print(f"skipped step {step}: {path.name} was removed while it was read (a training run's checkpoint.keep_last pruning it)", flush=True)
            continue
        evals_csv.append(csv_path, rows)
        scored_now.append(step)
        print(f"scored step {step} ({path.name}): {len(rows)} metrics appended to {csv_path}", flush=True)
    plot_evals(csv_path, run / "evals.png", f"{run.name}: downstream tasks")
    return {"run": str(run), "scored": scored_now, "already": sorted(done)}


def already_line(checkpoints: list[tuple[int, Path]], done: set[int], step: int | None) -> str:
    """What evals.csv holds of what this invocation looks at: every checkpoint, or eval.step's alone
    (each Slurm eval job's)."""
    if step is not None:
        return f"step {step} (eval.step) {'already' if step in done else 'not yet'} in evals.csv"
    return f"{sum(s in done for s, _ in checkpoints)} of {len(checkpoints)} checkpoints already in evals.csv"

"""Downstream tasks scored while training (eval.tasks, eval.where=inline): at every step the plan
names (each step checkpoint, or every eval.every_n_steps) and on the final weights, lm-eval scores
its tasks on the model in memory (train/eval_lm.py), on every rank together (ZeRO-3 and FSDP gather
weights inside the forward), in eval mode without gradients, and training goes on from the same
state: no RNG is reseeded (lm-eval's seeding is turned off) and the module is put back in train mode.

Rank 0 appends the scores to evals.csv (step, tokens, task, metric, value, stderr), logs them to
every logger but the CSV one (evals.csv is the CSV view) under eval/<task>/<metric>, and the run's
end plots each metric against tokens seen (evals.png). The time spent is reported as a share of
the run.

A scoring that raises (a task the plan could not check, such as a hub task whose data changed) is a
warning naming the step, the tasks and the error, as a failed eval.where=slurm job is: the step has
no rows (mode=eval on the run scores its checkpoint later) and training goes on, so the step's
checkpoint is still saved and a resume does not meet the same error before it.
"""

from __future__ import annotations

import logging
import os
import time
from contextlib import contextmanager
from pathlib import Path

import lightning.pytorch as pl

from tinytrain.train import evals_csv

log = logging.getLogger(__name__)


class DownstreamEvals(pl.Callback):
    def __init__(self, plan, run_dir: Path, *, tokenizer, true_vocab: int, tp: int, batch_size: int, max_steps: int, tokens_at, watched=None):
        self.evals = plan  # plan/evals.py's EvalPlan
        self.csv = Path(run_dir) / "evals.csv"
        self.tokenizer = tokenizer
        self.true_vocab = true_vocab
        self.tp = tp
        self.batch_size = batch_size
        self.max_steps = max_steps
        self.tokens_at = tokens_at  # step -> tokens seen by then
        self.scored: set[int] = set()
        self.seconds = 0.0
        self.scorings = 0
        self.failed: list[int] = []  # the steps whose scoring raised
        self.started: float | None = None
        self.run_seconds = 0.0
        self.manager = None
        self.watched = watched  # the hang watchdog's cluster/watched_rank.py WatchedRank, or None

    def on_train_start(self, trainer, pl_module):
        self.started = time.perf_counter()
        # Every rank decides alike: rank 0's reading of the file (a resumed run's earlier scores).
        self.scored = trainer.strategy.broadcast(self.earlier_scores(trainer.global_step) if trainer.is_global_zero else None)

    def earlier_scores(self, step: int) -> set[int]:
        """The steps up to `step` (where this run starts: a resumed run's checkpoint) already in
        evals.csv. Rows of later steps were scored before a kill on weights trained again now: they go."""
        dropped = evals_csv.drop_after(self.csv, step)
        if dropped:
            log.info("evals.csv: %d row(s) of steps after step %d dropped: those steps are trained again from its checkpoint and scored again", dropped, step)
        return evals_csv.scored_steps(self.csv)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step not in self.scored and self.evals.scores_at(step, self.max_steps) and step != self.max_steps:
            self.score(trainer, pl_module, step)

    def on_train_end(self, trainer, pl_module):
        if trainer.global_step not in self.scored:  # the final weights (a resumed run's already scored: not again)
            self.score(trainer, pl_module, trainer.global_step)
        self.run_seconds = time.perf_counter() - (self.started or time.perf_counter())

    def score(self, trainer, pl_module, step: int) -> None:
        import torch

        start = time.perf_counter()
        if self.watched is not None:
            # No beat while lm-eval runs: a scoring longer than a step is given the slow-phase limit, as validation is.
            self.watched.beat(phase="evals")
        was_training = pl_module.training
        pl_module.eval()
        try:
            with torch.inference_mode(False), torch.no_grad(), torch.compiler.set_stance("force_eager"), quiet_lm_eval():
                results = self.run_tasks(trainer, pl_module)
        except Exception as e:
            self.failed.append(step)
            if trainer.is_global_zero:
                log.warning(
                    "evals at step %d failed, %s raised %s: %s; no rows for this step, training goes on. Fix the task, then score the checkpoint with `python -m tinytrain mode=eval checkpoint=%s`",
                    step, ", ".join(self.evals.tasks), type(e).__name__, e, self.csv.parent,
                )
            return
        finally:
            pl_module.train(was_training)
        self.scored.add(step)
        self.scorings += 1
        seconds = time.perf_counter() - start
        self.seconds += seconds
        if not trainer.is_global_zero:
            return
        rows = evals_csv.rows_of(results, step, self.tokens_at(step))
        evals_csv.append(self.csv, rows)
        for logger in trainer.loggers:
            if type(logger).__name__ != "ResumableCSVLogger":  # evals.csv is the CSV view
                # Lightning logs optimizer step k as k - 1: the scores sit in the same row.
                logger.log_metrics({f"eval/{r['task']}/{r['metric']}": r["value"] for r in rows}, step=max(step - 1, 0))
        shown = ", ".join(f"{r['task']} {r['metric']} {r['value']:.4f}" for r in rows if r["metric"] in ("acc", "acc_norm", "word_perplexity", "bits_per_byte", "perplexity"))
        log.info("evals at step %d (%.1f s): %s", step, seconds, shown or f"{len(rows)} metrics in evals.csv")

    def run_tasks(self, trainer, pl_module) -> dict:
        from lm_eval import simple_evaluate
        from lm_eval.models.utils import resolve_max_length

        from tinytrain.plan import eval_tasks
        from tinytrain.train.eval_lm import TrainingModuleLM

        if self.manager is None:
            self.manager = eval_tasks.task_manager(self.evals.include, self.evals.builtin)
        lm = TrainingModuleLM(
            pl_module,
            self.tokenizer,
            true_vocab=self.true_vocab,
            max_length=resolve_max_length(pl_module.model.config, self.tokenizer),
            batch_size=self.batch_size,
            dp_rank=trainer.global_rank // self.tp,
            dp_size=max(trainer.world_size // self.tp, 1),
            forward_context=trainer.precision_plugin.forward_context,
        )
        # No seeding: the training RNG streams go on as they were (lm-eval seeds python, numpy and torch by default).
        out = simple_evaluate(model=lm, tasks=list(self.evals.tasks), task_manager=self.manager, limit=self.evals.limit, bootstrap_iters=BOOTSTRAP_ITERS, log_samples=False, random_seed=None, numpy_random_seed=None, torch_random_seed=None)
        return out["results"]

    def summary(self) -> dict:
        return {"eval_seconds": self.seconds, "eval_scorings": self.scorings, "eval_share": self.seconds / self.run_seconds if self.run_seconds else None, "eval_failed": self.failed}


# Resamples for the stderr of the metrics that have no closed form (a loglikelihood task's perplexity;
# lm-eval gives word and byte perplexities none); lm-eval's default (100,000) takes longer than the
# scoring. Serial: a pool forked from a training rank is unsafe.
BOOTSTRAP_ITERS = 1000


@contextmanager
def quiet_lm_eval():
    """lm-eval's per-task lines, its progress bars, its bootstrap pool and its environment report off
    for the scoring (and every rank its own rank 0)."""
    logger = logging.getLogger("lm_eval")
    level, before = logger.level, {k: os.environ.get(k) for k in QUIET}
    logger.setLevel(logging.ERROR)
    os.environ.update(QUIET)
    try:
        with without_environment_report():
            yield
    finally:
        logger.setLevel(level)
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextmanager
def without_environment_report():
    """simple_evaluate ends by adding a report of the machine to its results (add_env_info: torch's
    collect_env, which runs pip list, lscpu and the compilers as subprocesses, ~1.9 s on a 2-core
    machine) and the git commit of the working directory (`git describe` in a subprocess, which
    prints "fatal: not a git repository" outside one), on every rank here (each is lm-eval's rank 0)
    at every scoring. tinytrain keeps only the scores, so both are skipped for the call; a later
    lm-eval without them runs as is."""
    from lm_eval import evaluator

    skipped = {"add_env_info": lambda results: None, "get_git_commit_hash": lambda: None}
    before = {name: getattr(evaluator, name) for name in skipped if hasattr(evaluator, name)}
    for name in before:
        setattr(evaluator, name, skipped[name])
    try:
        yield
    finally:
        for name, original in before.items():
            setattr(evaluator, name, original)


# LOCAL_RANK 0: simple_evaluate returns its results only where LOCAL_RANK is 0 (it reads it for
# tensor-parallel models); every rank here needs them (each is rank 0 of 1 to lm-eval).
QUIET = {"DISABLE_MULTIPROC": "1", "TQDM_DISABLE": "1", "LOCAL_RANK": "0"}


def eval_callback(plan, run_dir: Path, tokenizer, tokens_at, watched=None) -> list:
    """The callback for this run ([] without eval.tasks). `tokens_at`: step -> training tokens seen by
    it (callbacks/tokens_seen.py); `watched`: this rank's hang watchdog, or None."""
    if plan.evals is None or plan.evals.where != "inline":
        return []
    from tinytrain.checkpoint.export import served_tokenizer

    return [
        DownstreamEvals(
            plan.evals,
            run_dir,
            tokenizer=served_tokenizer(tokenizer, plan.export),
            true_vocab=plan.vocab.true,
            tp=plan.parallel.tp,
            batch_size=plan.batch.micro_batch_size,
            max_steps=plan.max_steps,
            tokens_at=tokens_at,
            watched=watched,
        )
    ]

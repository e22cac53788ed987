"""DownstreamEvals (train/callbacks/evals.py) around its scoring, with lm-eval stood in for: the hang
watchdog's phase while it scores. The scores themselves are tests/integration/test_evals.py's."""

from types import SimpleNamespace

import torch

from tinytrain.cluster.heartbeat import PHASES
from tinytrain.plan.evals import EvalPlan
from tinytrain.plan.watchdog import WatchdogPlan
from tinytrain.train import evals_csv
from tinytrain.train.callbacks.evals import DownstreamEvals

RESULTS = {"tiny_mc": {"acc,none": 0.5, "acc_stderr,none": 0.1}}


class Watched:
    """cluster/watched_rank.py's WatchedRank, its phases recorded."""

    def __init__(self):
        self.phase = "train"

    def beat(self, step=None, phase=None):
        self.phase = phase or self.phase


def callback(tmp_path, run_tasks, watched=None) -> DownstreamEvals:
    plan = EvalPlan(("tiny_mc",), ("tiny_mc",), (), False, "inline", 2, "every 2 steps", None, 1)
    evals = DownstreamEvals(plan, tmp_path, tokenizer=None, true_vocab=8, tp=1, batch_size=1, max_steps=8, tokens_at=lambda step: step * 16, watched=watched)
    evals.run_tasks = run_tasks
    return evals


def trainer(step: int):
    return SimpleNamespace(global_step=step, is_global_zero=True, loggers=[], strategy=SimpleNamespace(broadcast=lambda x: x))


def test_scoring_runs_in_the_evals_phase_under_the_slow_phase_limit(tmp_path):
    watched = Watched()
    seen = []
    evals = callback(tmp_path, lambda trainer, module: seen.append(watched.phase) or RESULTS, watched)
    evals.on_train_batch_end(trainer(2), torch.nn.Linear(2, 2), None, None, 0)
    assert seen == ["evals"]  # a scoring longer than cluster.hang_timeout_s is no hang
    limits = WatchdogPlan(True, hang_s=5, startup_s=60, slow_s=1800, checkpoint_s=1800, process_group_timeout_s=1860, reason="").limits()
    assert limits["evals"] == 1800
    assert set(limits) == set(PHASES) - {"done"}  # every phase a rank can be in has its limit


def test_a_scoring_that_raises_is_a_warning_and_training_goes_on(tmp_path, caplog):
    def broken(trainer, module):
        raise ValueError("task tiny_mc: no such split 'test'")

    evals = callback(tmp_path, broken)
    module = torch.nn.Linear(2, 2)
    evals.on_train_batch_end(trainer(2), module, None, None, 0)  # StepCheckpoints' save follows it
    assert module.training  # back in train mode
    assert not (tmp_path / "evals.csv").exists()
    assert 2 not in evals.scored and evals.summary()["eval_failed"] == [2]
    assert "evals at step 2 failed, tiny_mc raised ValueError: task tiny_mc: no such split 'test'; no rows for this step, training goes on" in caplog.text
    assert "mode=eval checkpoint=" in caplog.text


def test_a_resumed_run_scores_again_the_steps_after_its_checkpoint(tmp_path):
    """Killed after scoring step 6, resumed from step 4's checkpoint: steps 5-6 are trained again,
    so step 6's earlier rows go and step 6 is scored again; steps 2 and 4 are not."""
    for step, value in ((2, 0.25), (4, 0.5), (6, 0.75)):
        evals_csv.append(tmp_path / "evals.csv", evals_csv.rows_of({"tiny_mc": {"acc,none": value}}, step, step * 16))
    scored = []
    evals = callback(tmp_path, lambda trainer, module: scored.append(trainer.global_step) or {"tiny_mc": {"acc,none": 1.0}})
    evals.on_train_start(trainer(4), None)
    assert evals.scored == {2, 4}
    assert evals_csv.scored_steps(tmp_path / "evals.csv") == {2, 4}
    for step in (4, 6):
        evals.on_train_batch_end(trainer(step), torch.nn.Linear(2, 2), None, None, 0)
    assert scored == [6]
    assert [(r["step"], r["value"]) for r in evals_csv.read(tmp_path / "evals.csv")] == [("2", "0.25"), ("4", "0.5"), ("6", "1.0")]


def test_scoring_runs_no_subprocess_for_lm_eval_s_environment_report_or_git_hash(monkeypatch):
    """lm-eval's results end with a machine report (pip list, lscpu: ~1.9 s) and `git describe` of
    the working directory ("fatal: not a git repository" outside one), at every scoring of every rank."""
    import subprocess

    from lm_eval import evaluator

    from tinytrain.train.callbacks.evals import without_environment_report

    def no_subprocess(*args, **kwargs):
        raise AssertionError(f"a subprocess: {args}")

    monkeypatch.setattr(subprocess, "check_output", no_subprocess)
    monkeypatch.setattr(subprocess, "run", no_subprocess)
    original = evaluator.get_git_commit_hash
    with without_environment_report():
        assert evaluator.get_git_commit_hash() is None
        evaluator.add_env_info({})
    assert evaluator.get_git_commit_hash is original

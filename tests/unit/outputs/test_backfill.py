"""mode=eval on a run folder (outputs/backfill.py): the tokens its rows carry and the line it prints.
The scoring itself is tests/integration/test_evals.py's."""

from __future__ import annotations

import json

from omegaconf import OmegaConf

from tests.conftest import compose
from tinytrain.outputs import backfill
from tinytrain.plan.planner import make_plan

RAMP = ["trainer.max_steps=10", "trainer.micro_batch_size=4", "trainer.global_batch_size=8", "trainer.batch_size_warmup.start=2", "trainer.batch_size_warmup.tokens=576"]


def saved_run(run, overrides, bundled_tokenizer):
    """A run folder as training leaves it: its plan.json and config_resolved.yaml."""
    cfg = compose(overrides)
    plan = make_plan(cfg, bundled_tokenizer, run)
    run.mkdir()
    (run / "plan.json").write_text(json.dumps(plan.to_dict()))
    (run / "config_resolved.yaml").write_text(OmegaConf.to_yaml(plan.resolved_config(cfg)))
    return plan


def test_tokens_under_a_batch_warmup_are_counted_as_the_inline_scoring_counts_them(tmp_path, bundled_tokenizer):
    plan = saved_run(tmp_path / "run", RAMP, bundled_tokenizer)
    tokens = [backfill.tokens_at(tmp_path / "run", step) for step in range(11)]
    assert tokens == [plan.batch.tokens_over(step) for step in range(11)]  # the inline rows' tokens
    assert tokens[2] < 2 * plan.batch.tokens_per_step  # the ramp's smaller steps counted as they are
    flat = saved_run(tmp_path / "flat", RAMP[:3], bundled_tokenizer)
    assert backfill.tokens_at(tmp_path / "flat", 4) == 4 * flat.batch.tokens_per_step


def test_a_slurm_eval_jobs_line_says_what_evals_csv_holds_of_its_step():
    checkpoints = [(4, None), (8, None), (10, None)]
    assert backfill.already_line(checkpoints, {4, 8}, None) == "2 of 3 checkpoints already in evals.csv"
    assert backfill.already_line(checkpoints, {4}, 8) == "step 8 (eval.step) not yet in evals.csv"
    assert backfill.already_line(checkpoints, {4, 8}, 8) == "step 8 (eval.step) already in evals.csv"


def test_a_checkpoint_s_recorded_tokens_count_over_the_plan_s(tmp_path, bundled_tokenizer):
    """A run resumed under another batch trained its earlier steps at the old one: each checkpoint
    records the tokens seen by its step (train/callbacks/tokens_seen.py), and those are its rows'."""
    import torch

    plan = saved_run(tmp_path / "run", RAMP[:3], bundled_tokenizer)
    checkpoint = tmp_path / "run" / "step0000004.ckpt"
    torch.save({"global_step": 4, "callbacks": {"TokensSeen": {"step": 4, "tokens": 1234}}}, checkpoint)
    assert backfill.tokens_at(tmp_path / "run", 4, checkpoint) == 1234
    torch.save({"global_step": 4}, checkpoint)  # saved before tokens were recorded: the plan's count
    assert backfill.tokens_at(tmp_path / "run", 4, checkpoint) == 4 * plan.batch.tokens_per_step


def test_a_checkpoint_pruned_while_the_run_is_scored_is_skipped_and_the_others_go_on(tmp_path, bundled_tokenizer, monkeypatch, capsys):
    """mode=eval beside a run still training (checkpoint.keep_last=1): a step checkpoint listed for
    scoring was deleted before it was read, and the whole backfill stopped on it (exit 2, under
    a key named `export`)."""
    from tests.integration.test_evals import write_tasks

    tasks = tmp_path / "tasks"
    write_tasks(tasks)
    saved_run(tmp_path / "run", RAMP[:3], bundled_tokenizer)
    pruned = tmp_path / "run" / "checkpoints" / "step0000004.ckpt"  # listed, then removed by keep_last
    monkeypatch.setattr(backfill, "run_checkpoints", lambda run: [(4, pruned)])
    cfg = compose(["mode=eval", f"checkpoint.path={tmp_path / 'run'}", "eval.tasks=[tiny_cloze]", f"eval.include=[{tasks}]"])

    def never(*args):
        raise AssertionError("nothing to score: its checkpoint is gone")

    result = backfill.backfill(cfg, tmp_path / "run", tmp_path / "out", never)
    assert result["scored"] == []
    assert "skipped step 4: step0000004.ckpt was removed while it was read" in capsys.readouterr().out


def test_a_run_folder_scores_cannot_be_written_to_is_named_before_any_scoring(tmp_path, bundled_tokenizer, monkeypatch):
    """evals.csv (and its lock) go into the run folder: an unwritable one failed after the first
    scoring. As root (CI) no mode bits refuse a write, so the folder's answer to os.access is set here."""
    import os

    import torch

    saved_run(tmp_path / "run", RAMP[:3], bundled_tokenizer)
    (tmp_path / "run" / "checkpoints").mkdir()
    torch.save({"global_step": 4}, tmp_path / "run" / "checkpoints" / "step0000004.ckpt")
    cfg = compose(["mode=eval", f"checkpoint.path={tmp_path / 'run'}", "eval.tasks=[hellaswag]"])
    assert backfill.problems(cfg, tmp_path / "run") == []
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: False if os.fspath(path) == str(tmp_path / "run") else real(path, mode))
    (problem,) = backfill.problems(cfg, tmp_path / "run")
    assert problem.key == "checkpoint.path" and "is not writable, and the scores are appended to its evals.csv" in problem.message


def test_a_run_s_own_task_folder_with_python_runs_only_when_the_command_names_it(tmp_path, bundled_tokenizer):
    """`mode=eval checkpoint.path=<run>` took the run's eval.include, whose `!function` Python lm-eval
    imported to build the tasks: a run copied from elsewhere ran its code on being scored."""
    import torch

    from tinytrain.outputs import validate_modes

    tasks, marker = tmp_path / "tasks", tmp_path / "ran"
    tasks.mkdir()
    (tasks / "utils.py").write_text(f"open({str(marker)!r}, 'w').close()\n\ndef process_docs(docs):\n    return docs\n")
    (tasks / "evil.yaml").write_text("task: evil\nprocess_docs: !function utils.process_docs\n")
    saved_run(tmp_path / "run", [*RAMP[:3], "eval.tasks=[evil]", f"eval.include=[{tasks}]"], bundled_tokenizer)
    (tmp_path / "run" / "checkpoints").mkdir()
    torch.save({"global_step": 4}, tmp_path / "run" / "checkpoints" / "step0000004.ckpt")
    inherited = compose(["mode=eval", f"checkpoint.path={tmp_path / 'run'}"])
    (problem,) = validate_modes.problems(inherited, tmp_path / "out", False)
    assert problem.key == "eval.include" and f"{tasks / 'utils.py'}" in problem.message and f"{tasks / 'evil.yaml'} (!function)" in problem.message
    assert problem.fix.endswith(f"eval.include=[{tasks}]")
    assert not marker.exists()
    named = compose(["mode=eval", f"checkpoint.path={tmp_path / 'run'}", f"eval.include=[{tasks}]"])
    assert backfill.inherited_code_problems(named, tmp_path / "run") == []  # as the run's Slurm eval jobs name them

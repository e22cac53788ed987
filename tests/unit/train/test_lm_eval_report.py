"""quiet_lm_eval (train/callbacks/evals.py), around every inline scoring: lm-eval's simple_evaluate
scores the tasks as it would, without the machine report it ends with (add_env_info: torch's
collect_env, which runs pip list, lscpu and the compilers as subprocesses, ~1.9 s on every rank at
every scoring, for results tinytrain discards but for the scores); lm-eval is as it was afterwards."""

import importlib.util

import pytest

# Not importorskip: importing lm-eval sets HF_XET_HIGH_PERFORMANCE, which, set while collecting, would
# send every later command of this worker to a fresh interpreter (tests/zygote.py).
pytestmark = pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm-eval is not installed (pip install -e '.[eval]')")


def score(tasks_dir) -> dict:
    from lm_eval import simple_evaluate
    from lm_eval.models.dummy import DummyLM
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=[str(tasks_dir)], include_defaults=False)
    return simple_evaluate(model=DummyLM(), tasks=["tiny_choice"], task_manager=manager, limit=4, bootstrap_iters=0, log_samples=False)


def test_the_scores_without_the_machine_report(tmp_path):
    from lm_eval import evaluator

    from tests.integration.test_evals import write_tasks
    from tinytrain.train.callbacks.evals import quiet_lm_eval

    write_tasks(tmp_path)  # the local tasks the inline-eval tests score
    report = evaluator.add_env_info  # simple_evaluate calls it (tests/unit/test_private_names.py)
    with quiet_lm_eval():
        quiet = score(tmp_path)
    assert "pretty_env_info" not in quiet and "acc,none" in quiet["results"]["tiny_choice"]
    assert evaluator.add_env_info is report
    empty: dict = {}
    report(empty)
    assert "pretty_env_info" in empty  # what lm-eval adds by itself

"""The evaluation plan: when a run scores its tasks, and the plan line that says so."""

from tinytrain.plan.evals import EvalPlan, render


def plan(every, cadence, limit=None, shards=2) -> EvalPlan:
    return EvalPlan(("mmlu", "tiny"), ("mmlu_anatomy", "mmlu_astronomy", "tiny"), (), True, "inline", every, cadence, limit, shards)


def test_scored_at_each_cadence_step_and_the_final_weights():
    every = plan(100, "every step checkpoint")
    assert [s for s in range(0, 251) if every.scores_at(s, 250)] == [100, 200, 250]  # not 0: accumulating micro batches end at step 0
    end = plan(None, "the final weights")
    assert [s for s in range(1, 251) if end.scores_at(s, 250)] == [250]


def test_plan_line_says_which_tasks_where_when_and_the_limit():
    line = render(plan(100, "every step checkpoint", limit=50).to_dict(), 250)
    assert line == (
        "evals      mmlu, tiny (3 tasks): inline on the training ranks (requests split over 2 data-parallel rank(s)), "
        "at every step checkpoint (every 100 steps) and the final weights: 3 scoring(s); limit 50 documents per task -> evals.csv, eval/<task>/<metric> in the loggers"
    )
    assert "at the final weights: 1 scoring(s); every document" in render(plan(None, "the final weights").to_dict(), 250)


def test_plan_line_of_slurm_jobs():
    ev = {**plan(100, "every step checkpoint").to_dict(), "where": "slurm"}
    assert "mmlu, tiny (3 tasks): a one-GPU Slurm job per checkpoint (lm-eval's hf model on its export; training does not wait), at every step checkpoint" in render(ev, 250)
    assert render(ev, 250).endswith("-> evals.csv (appended by each job)")

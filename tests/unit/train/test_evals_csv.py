"""evals.csv: lm-eval's results as rows, one step's rows appended at once (a rescored step replaced), a resumed run's later steps dropped."""

from tinytrain.train import evals_csv

RESULTS = {
    "tiny_mc": {"alias": "tiny_mc", "acc,none": 0.5, "acc_stderr,none": 0.1, "acc_norm,none": 0.25, "acc_norm_stderr,none": "N/A", "sample_len": 4},
    "tiny_gen": {"exact_match,strict-match": 1, "exact_match_stderr,strict-match": 0.0},
}


def test_results_become_rows_with_their_stderr():
    rows = evals_csv.rows_of(RESULTS, step=4, tokens=1024)
    assert rows == [
        {"step": 4, "tokens": 1024, "task": "tiny_gen", "metric": "exact_match/strict-match", "value": 1.0, "stderr": 0.0},
        {"step": 4, "tokens": 1024, "task": "tiny_mc", "metric": "acc", "value": 0.5, "stderr": 0.1},
        {"step": 4, "tokens": 1024, "task": "tiny_mc", "metric": "acc_norm", "value": 0.25, "stderr": ""},
    ]


def test_append_keeps_other_steps_and_tasks_and_replaces_a_rescored_task(tmp_path):
    path = tmp_path / "evals.csv"
    evals_csv.append(path, evals_csv.rows_of(RESULTS, step=8, tokens=2048))
    evals_csv.append(path, evals_csv.rows_of(RESULTS, step=4, tokens=1024))
    evals_csv.append(path, evals_csv.rows_of({"tiny_mc": {"acc,none": 0.75}}, step=8, tokens=2048))
    rows = evals_csv.read(path)
    assert [(r["step"], r["task"], r["metric"], r["value"]) for r in rows] == [
        ("4", "tiny_gen", "exact_match/strict-match", "1.0"),
        ("4", "tiny_mc", "acc", "0.5"),
        ("4", "tiny_mc", "acc_norm", "0.25"),
        ("8", "tiny_gen", "exact_match/strict-match", "1.0"),
        ("8", "tiny_mc", "acc", "0.75"),
    ]
    assert evals_csv.scored_steps(path) == {4, 8}
    assert evals_csv.scored_tasks(path) == {4: {"tiny_gen", "tiny_mc"}, 8: {"tiny_gen", "tiny_mc"}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["evals.csv", "evals.csv.lock"]  # no temporary file left behind (the lock file stays)


def test_a_resumed_run_drops_the_rows_after_its_step(tmp_path):
    path = tmp_path / "evals.csv"
    assert evals_csv.drop_after(path, 4) == 0 and not path.exists()  # a run without evals.csv yet
    for step in (4, 6, 8):
        evals_csv.append(path, evals_csv.rows_of(RESULTS, step=step, tokens=step * 256))
    assert evals_csv.drop_after(path, 4) == 2 * 3  # steps 6 and 8, three metrics each
    assert evals_csv.scored_steps(path) == {4}
    assert evals_csv.drop_after(path, 4) == 0

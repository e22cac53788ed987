"""Downstream tasks scored while training (eval.tasks, issue 36): one training run per strategy
(single; zero3 and fsdp_tp with 2 CPU processes) scores local tiny lm-eval tasks (multiple choice,
log-likelihood and rolling log-likelihood, JSONL + YAML written here; no hub) at each checkpoint and
on the final weights, and the final scores equal lm-eval's own `hf` model on the run's export:
accuracies exactly, log-likelihoods (as log perplexities and bits per byte) within 1e-5.

The requests are split over the data-parallel ranks with uneven shards (the padding forwards run),
which the equality checks too.
"""

from __future__ import annotations

import csv
import json
import math

import pytest

from tests.cli_in_process import kept_environment
from tests.conftest import DEEPSPEED_ON_CPU, run_cli

pytestmark = pytest.mark.slow

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
TASKS = ["tiny_choice", "tiny_cloze", "tiny_text"]
LIMIT = 7
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
WORDS = "the king said unto his people that the river runs cold and the bread is warm in the morning light".split()


def write_tasks(folder) -> None:
    """A multiple-choice task (acc, acc_norm), a cloze one (loglikelihood: perplexity, greedy acc)
    and a text one (loglikelihood_rolling: word and byte perplexities, bits per byte)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = {
        "choice": [{"question": f"{' '.join(WORDS[i : i + 5])}?", "choices": [f" {WORDS[(i + k) % len(WORDS)]}" for k in range(3)], "answer": i % 3} for i in range(9)],
        "cloze": [{"context": " ".join(WORDS[i : i + 6]), "target": f" {WORDS[(i + 6) % len(WORDS)]}"} for i in range(9)],
        "text": [{"text": " ".join(WORDS[i:] + WORDS[:i]) * (1 + i % 3)} for i in range(9)],
    }
    for name, records in rows.items():
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    head = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (folder / "tiny_choice.yaml").write_text("task: tiny_choice\n" + head.format(data=folder / "choice.jsonl") + "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n  - metric: acc_norm\n")
    (folder / "tiny_cloze.yaml").write_text("task: tiny_cloze\n" + head.format(data=folder / "cloze.jsonl") + "output_type: loglikelihood\ndoc_to_text: '{{context}}'\ndoc_to_target: '{{target}}'\nmetric_list:\n  - metric: perplexity\n  - metric: acc\n")
    (folder / "tiny_text.yaml").write_text("task: tiny_text\n" + head.format(data=folder / "text.jsonl") + "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\nmetric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")


def reference_scores(export_dir, tasks_dir) -> dict:
    """lm-eval's own hf model on the export, for the same tasks and limit. In this process: what its
    import and its run set in os.environ (HF_XET_HIGH_PERFORMANCE, KMP_DUPLICATE_LIB_OK) is undone,
    or the test's later commands would each start a fresh interpreter (tests/zygote.py)."""
    with kept_environment():
        import lm_eval
        from lm_eval.tasks import TaskManager

        out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={export_dir},dtype=float32", tasks=TASKS, task_manager=TaskManager(include_path=[str(tasks_dir)], include_defaults=False), limit=LIMIT, device="cpu", batch_size=3, bootstrap_iters=0, log_samples=False)
    return out["results"]


def read_evals(run_dir) -> list[dict]:
    with (run_dir / "evals.csv").open() as f:
        return list(csv.DictReader(f))


def assert_equal_to_lm_eval(run_dir, tasks_dir, final_step: int) -> None:
    rows = [r for r in read_evals(run_dir) if int(r["step"]) == final_step]
    reference = reference_scores(run_dir / "hf_export", tasks_dir)
    compared = 0
    for r in rows:
        expected = reference[r["task"]][f"{r['metric']},none"]
        value = float(r["value"])
        if r["metric"] in ("acc", "acc_norm"):
            assert value == expected, (r, expected)
        elif r["metric"] == "bits_per_byte":
            assert abs(value - expected) < 1e-5, (r, expected)
        else:  # perplexities: their logs are mean log-likelihoods
            assert abs(math.log(value) - math.log(expected)) < 1e-5, (r, expected)
        compared += 1
    assert compared == 2 + 2 + 3, rows


def train(tmp_path, name: str, extra: list[str]):
    tasks_dir = tmp_path / "tasks"
    if not tasks_dir.exists():
        write_tasks(tasks_dir)
    run_dir = tmp_path / name
    args = ["experiment=smoke", *MODEL, "trainer.progress_bar=false", "trainer.micro_batch_size=2", "export.dtype=fp32", f"eval.tasks=[{','.join(TASKS)}]", f"eval.include=[{tasks_dir}]", f"eval.limit={LIMIT}", *extra]
    r = run_cli(args, run_dir, env=OFFLINE)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return run_dir, tasks_dir, r


def test_inline_evals_on_single_equal_lm_eval_on_the_export(tmp_path):
    run_dir, tasks_dir, r = train(tmp_path, "single", [])
    assert "evals      tiny_choice, tiny_cloze, tiny_text: inline on the training ranks (requests split over 1 data-parallel rank(s)), at every step checkpoint (every 4 steps) and the final weights: 2 scoring(s); limit 7 documents per task" in r.stdout
    rows = read_evals(run_dir)
    assert sorted({(int(x["step"]), int(x["tokens"])) for x in rows}) == [(4, 4 * 2 * 64), (8, 8 * 2 * 64)]  # each checkpoint's step and the tokens seen by then
    assert {x["task"] for x in rows} == set(TASKS)
    assert all(x["stderr"] for x in rows if x["metric"] in ("acc", "acc_norm", "perplexity"))  # perplexity's bootstrapped
    assert not any(x["stderr"] for x in rows if x["metric"] in ("word_perplexity", "byte_perplexity", "bits_per_byte"))  # lm-eval gives none
    assert "evals: 2 scoring(s) of tiny_choice, tiny_cloze, tiny_text took" in r.stdout and "% of the run" in r.stdout
    assert (run_dir / "evals.png").stat().st_size > 0
    assert_equal_to_lm_eval(run_dir, tasks_dir, final_step=8)

    # mode=eval on the run folder backfills: nothing is recomputed while every checkpoint is scored;
    # a step missing (as when killed before its rows) is scored from its checkpoint, to the inline values.
    backfill = run_cli(["mode=eval", f"checkpoint.path={run_dir}"], tmp_path / "backfill", env=OFFLINE)
    assert backfill.returncode == 0, backfill.stderr[-3000:]
    assert "2 of 2 checkpoints already in evals.csv; scoring none" in backfill.stdout
    inline = {(x["task"], x["metric"]): float(x["value"]) for x in rows if x["step"] == "4"}
    with (run_dir / "evals.csv").open("w") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(x for x in rows if x["step"] != "4")
    # A comma in the folder lm-eval loads (this command's run dir holds the export it scores): its
    # model_args string was split there (and "m,trust_remote_code=True" set that argument).
    backfill = run_cli(["mode=eval", f"checkpoint.path={run_dir}", f"hydra.run.dir='{tmp_path / 'back,fill'}'"], None, env=OFFLINE)
    assert backfill.returncode == 0, backfill.stderr[-3000:]
    assert "1 of 2 checkpoints already in evals.csv; scoring step 4 on tiny_choice, tiny_cloze, tiny_text" in backfill.stdout
    again = {(x["task"], x["metric"]): float(x["value"]) for x in read_evals(run_dir) if x["step"] == "4"}
    assert again.keys() == inline.keys()
    for key, value in inline.items():
        assert abs(math.log(again[key]) - math.log(value)) < 1e-5 if "perplexity" in key[1] else abs(again[key] - value) < 1e-5, (key, value, again[key])


# zero3: the requests split over 2 data-parallel ranks; fsdp_tp (tp 2): both ranks score the same requests.
@pytest.mark.parametrize("parallel", [["parallel=zero3", *DEEPSPEED_ON_CPU], ["parallel=fsdp_tp", "cluster.devices=2", "parallel.tp=2"]], ids=["zero3", "fsdp_tp2"])
def test_inline_evals_on_two_ranks_equal_lm_eval_on_the_export(parallel, tmp_path):
    run_dir, tasks_dir, r = train(tmp_path, "run", [*parallel, "trainer.max_steps=4", "trainer.val_every_n_steps=4"])
    shards = 1 if "parallel.tp=2" in parallel else 2
    assert f"requests split over {shards} data-parallel rank(s)" in r.stdout
    assert sorted({int(x["step"]) for x in read_evals(run_dir)}) == [4]
    assert_equal_to_lm_eval(run_dir, tasks_dir, final_step=4)

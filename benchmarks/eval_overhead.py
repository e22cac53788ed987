"""Inline downstream evaluation's cost (eval.tasks, eval.where=inline): the seconds one scoring of
the tasks takes at a checkpoint, as a share of the training time between two checkpoints, for two
model sizes, each a real `python -m tinytrain` run (single, CPU here) that scores at every
checkpoint.

The tasks are local (written here, no hub): a multiple-choice task of 4 choices and a text task
scored by rolling log-likelihood, eval.limit documents each. The run's end-of-run line gives the
scoring time and its share of the training loop; the training time between checkpoints is the
loop's time without the scorings, over the number of checkpoints.

    python benchmarks/eval_overhead.py [--limit 50] [--every 20] [--checkpoints 2]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import REPO

SIZES = {
    "h64 x 2": ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"],
    "h256 x 4": ["model.num_layers=4", "model.hidden_size=256", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=704"],
}
SUMMARY = re.compile(r"evals: (\d+) scoring\(s\) of .* took ([\d.]+) s, ([\d.]+)% of the run")
WORDS = "the king said unto his people that the river runs cold and the bread is warm in the morning light of spring".split()


def write_tasks(folder: Path, docs: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    choice = [{"question": " ".join(WORDS[i % 9 : i % 9 + 8]), "choices": [f" {WORDS[(i + k) % len(WORDS)]}" for k in range(4)], "answer": i % 4} for i in range(docs)]
    text = [{"text": " ".join(WORDS[i % 7 :] + WORDS[: i % 7]) * 4} for i in range(docs)]
    for name, rows in (("choice", choice), ("text", text)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    head = "dataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {data}\ntest_split: test\n"
    (folder / "bench_choice.yaml").write_text("task: bench_choice\n" + head.format(data=folder / "choice.jsonl") + "output_type: multiple_choice\ndoc_to_text: '{{question}}'\ndoc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n")
    (folder / "bench_text.yaml").write_text("task: bench_text\n" + head.format(data=folder / "text.jsonl") + "output_type: loglikelihood_rolling\ndoc_to_text: ''\ndoc_to_target: '{{text}}'\nmetric_list:\n  - metric: word_perplexity\n")


def measure(size: list[str], tasks: Path, run_dir: Path, *, limit: int, every: int, checkpoints: int) -> tuple[int, float, float]:
    """(scorings, eval seconds, eval share of the training loop) of one run."""
    args = [
        "experiment=smoke",
        *size,
        "trainer.progress_bar=false",
        "trainer.plot=false",
        "trainer.export=false",
        f"trainer.max_steps={every * checkpoints}",
        f"trainer.checkpoint_every_n_steps={every}",
        f"trainer.val_every_n_steps={every * checkpoints}",
        "data.seq_len=128",
        "eval.tasks=[bench_choice,bench_text]",
        f"eval.include=[{tasks}]",
        f"eval.limit={limit}",
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    r = subprocess.run([sys.executable, "-m", "tinytrain", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    m = SUMMARY.search(r.stdout)
    if r.returncode != 0 or not m:
        raise SystemExit(f"run failed:\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return int(m.group(1)), float(m.group(2)), float(m.group(3)) / 100


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--limit", type=int, default=50, help="documents per task")
    p.add_argument("--every", type=int, default=20, help="optimizer steps between checkpoints")
    p.add_argument("--checkpoints", type=int, default=2)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tasks = Path(tmp) / "tasks"
        write_tasks(tasks, a.limit)
        print(f"{a.limit} documents per task (4-way multiple choice + rolling text), a checkpoint every {a.every} steps (micro batch 4 x seq 128), {a.checkpoints} checkpoints")
        print("| model | scorings | s per scoring | training s between checkpoints | eval / training between checkpoints | eval share of the run |")
        print("|---|---|---|---|---|---|")
        for name, size in SIZES.items():
            scorings, seconds, share = measure(size, tasks, Path(tmp) / name.replace(" ", ""), limit=a.limit, every=a.every, checkpoints=a.checkpoints)
            training = seconds / share - seconds  # the loop's time without the scorings
            print(f"| {name} | {scorings} | {seconds / scorings:.2f} | {training / a.checkpoints:.2f} | {seconds / training:.3f} | {share:.3f} |", flush=True)


if __name__ == "__main__":
    main()

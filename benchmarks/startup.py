"""Start-up cost, each side as a fresh process, alternated and repeated (median):

1. process start -> first optimizer step: `python -m tinytrain` (its default run, stopped after
   one step) vs benchmarks/raw_first_step.py (the same model, tokenizer and corpus in a raw loop).
   Both report seconds since the OS created the process.
2. `python -m tinytrain mode=plan model=llama3_8b` vs `python -c "import torch, transformers"`,
   wall time.

    python benchmarks/startup.py [--repeats 3]
Targets: both ratios <= 1.5.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time

from _common import REPO, median

FIRST_STEP = re.compile(r"first optimizer step done ([\d.]+) s after process start")


def first_step_seconds(cmd: list[str]) -> float:
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    m = FIRST_STEP.search(r.stdout + r.stderr)
    if r.returncode != 0 or not m:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return float(m.group(1))


def wall_seconds(cmd: list[str]) -> float:
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{r.stderr[-2000:]}")
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    py = sys.executable
    ours_step, raw_step, ours_plan, raw_import = [], [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            ours_step.append(first_step_seconds([py, "-m", "tinytrain", "trainer.max_steps=1", "trainer.warmup_steps=0", "trainer.export=false", "trainer.plot=false", "trainer.progress_bar=false", f"hydra.run.dir={tmp}/train{i}"]))
            raw_step.append(first_step_seconds([py, "benchmarks/raw_first_step.py"]))
            ours_plan.append(wall_seconds([py, "-m", "tinytrain", "mode=plan", "model=llama3_8b", f"hydra.run.dir={tmp}/plan{i}"]))
            raw_import.append(wall_seconds([py, "-c", "import torch, transformers"]))
    a, b, c, d = map(median, (ours_step, raw_step, ours_plan, raw_import))
    print(f"to first optimizer step: tinytrain {a:.2f} s, raw loop {b:.2f} s, ratio {a / b:.2f}  (target <= 1.5; runs {ours_step} vs {raw_step})")
    print(f"plan llama3_8b: tinytrain {c:.2f} s, 'import torch, transformers' {d:.2f} s, ratio {c / d:.2f}  (target <= 1.5)")


if __name__ == "__main__":
    main()

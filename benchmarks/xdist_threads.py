"""Torch threads per pytest-xdist worker, as `make test` runs the suite: the same test modules
under `pytest -n <cores>`, with torch's default of a thread per core in every worker and every
training process its tests start (`OMP_NUM_THREADS=<cores>`), against one thread each
(`OMP_NUM_THREADS=1`, what tests/conftest.py sets under xdist). Alternated A B B A ... so drift
in the machine's load falls on both sides.

    python benchmarks/xdist_threads.py [--rounds 2] [modules ...]
Target: one thread per worker faster (ratio default / one > 1).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from _common import REPO, median

# CPU-bound training modules of about a minute each alone: single, DDP and DeepSpeed runs.
DEFAULT_MODULES = ["tests/integration/test_train_cpu.py", "tests/integration/test_yi_like.py"]


def suite_seconds(modules: list[str], workers: int, threads: int) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", str(workers), "--dist", "loadscope", *modules]
    start = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - start
    if r.returncode != 0:
        raise SystemExit(f"OMP_NUM_THREADS={threads} {' '.join(cmd)} failed:\n{r.stdout[-3000:]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2, help="pairs of runs (A B, then B A, ...)")
    parser.add_argument("modules", nargs="*", default=DEFAULT_MODULES)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    sides = {"default": cores, "one": 1}
    times: dict[str, list[float]] = {name: [] for name in sides}
    print(f"{len(args.modules)} modules on {cores} xdist workers; default = {cores} torch threads per process, one = 1")
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(reversed(sides))
        for name in order:
            times[name].append(suite_seconds(args.modules, cores, sides[name]))
            print(f"  round {r + 1} {name:>7}: {times[name][-1]:7.1f} s", flush=True)
    default, one = median(times["default"]), median(times["one"])
    print(f"median: default {default:.1f} s, one thread per worker {one:.1f} s, ratio default / one = {default / one:.2f}")


if __name__ == "__main__":
    main()

"""Host memory of real CPU runs against the plan's `host` line (plan/host_memory.py), at three
model sizes and 1 and 2 processes (ddp over gloo).

Each run is `python -m tinytrain` for a few steps in a fresh process tree; the peak of the tree's
summed resident set size (psutil, sampled every 20 ms) is set against the plan's per-node peak
(plan.json host_memory.peak_bytes) and its exact part (exact_bytes: the states, without the
activation estimate). A ratio near 1 means the line is what a node needs; above 1, the plan
promises memory the run overruns (a node would be refused too late); below 1, room the plan
holds back. The plan's per-process runtime (1 GiB) is the part that does not grow.

    python benchmarks/host_memory.py [--sizes 5M,40M,150M] [--ranks 1,2] [--steps 4]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from _common import REPO

# hidden, layers, heads, intermediate: with the bundled 4096-token tokenizer
SIZES = {"5M": (256, 4, 4, 704), "40M": (640, 8, 10, 1728), "150M": (1024, 12, 16, 2816)}
GIB = 1024**3


def tree_peak_rss(proc: subprocess.Popen, interval: float = 0.02) -> int:
    """The highest sum of RSS over `proc` and its descendants until it exits."""
    import psutil

    root, peak = psutil.Process(proc.pid), 0
    while proc.poll() is None:
        total = 0
        try:
            for p in [root, *root.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        peak = max(peak, total)
        time.sleep(interval)
    return peak


def run(size: str, ranks: int, steps: int) -> dict:
    hidden, layers, heads, inter = SIZES[size]
    with tempfile.TemporaryDirectory() as root:
        args = [
            sys.executable,
            "-m",
            "tinytrain",
            f"run.root={root}",
            "model=tiny",
            f"model.hidden_size={hidden}",
            f"model.num_layers={layers}",
            f"model.num_heads={heads}",
            f"model.num_kv_heads={heads}",
            f"model.intermediate_size={inter}",
            f"trainer.max_steps={steps}",
            "trainer.warmup_steps=1",
        ]
        if ranks > 1:
            args += ["parallel=ddp", f"cluster.devices={ranks}"]
        proc = subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        out: list[str] = []
        reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)
        reader.start()
        peak = tree_peak_rss(proc)
        reader.join()
        if proc.returncode:
            raise SystemExit(f"{' '.join(args)} exited {proc.returncode}:\n{''.join(out)[-3000:]}")
        plan = json.loads(next(Path(root).glob("*/plan.json")).read_text())
    host = plan["host_memory"]
    return {"size": size, "params": plan["params"]["total"], "ranks": ranks, "measured": peak, "planned": host["peak_bytes"], "exact": host["exact_bytes"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default=",".join(SIZES))
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--steps", type=int, default=4)
    a = ap.parse_args()
    print(f"{'size':>5} {'params':>12} {'ranks':>5} {'measured GiB':>12} {'plan peak GiB':>13} {'exact GiB':>9} {'measured/peak':>13} {'measured/exact':>14}")
    for size in a.sizes.split(","):
        for ranks in (int(r) for r in a.ranks.split(",")):
            r = run(size, ranks, a.steps)
            print(
                f"{r['size']:>5} {r['params']:>12,} {r['ranks']:>5} {r['measured'] / GIB:>12.2f} {r['planned'] / GIB:>13.2f} {r['exact'] / GIB:>9.2f} "
                f"{r['measured'] / r['planned']:>13.2f} {r['measured'] / r['exact']:>14.2f}",
                flush=True,
            )


if __name__ == "__main__":
    main()

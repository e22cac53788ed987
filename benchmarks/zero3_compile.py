"""Compiled blocks under ZeRO-3, side by side with eager: `python -m tinytrain` on two CPU ranks
(DeepSpeed's CPU accelerator over gloo), the same model, data and seed, `trainer.compile=none` and
`blocks` alternated --repeats times. For each run: its speed, rank 0's graph breaks and recompiles from
torch's logs, and every step's loss against the first eager run's. The speed is the median of the
per-step tokens/s tinytrain logs from the fourth step on: the compile (and the one recompile, at the
second step, where the attention mask first arrives) are left out.

    python benchmarks/zero3_compile.py [--layers 12 --hidden 256 --seq 256 --steps 20 --backend inductor]

Expect no graph break and a recompile or none under blocks (each layer a DeepSpeed leaf module whose
forward is compiled inside its hooks: tinytrain/model/zero3_layers.py, tinytrain/model/compile.py),
losses equal to eager's within float rounding, and the step's ratio to eager below 1 where the
backend's kernels beat eager's (inductor's C++ on a CPU, Triton on a GPU).
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FIRST_TIMED_STEP = 3


def run(mode: str, args, run_dir: Path) -> dict:
    heads = max(2, args.hidden // 64)
    overrides = [
        "experiment=smoke",
        f"model.num_layers={args.layers}",
        f"model.hidden_size={args.hidden}",
        f"model.num_heads={heads}",
        f"model.num_kv_heads={heads // 2}",
        f"model.intermediate_size={args.hidden * 8 // 3 // 64 * 64}",
        f"data.seq_len={args.seq}",
        f"trainer.max_steps={args.steps}",
        "trainer.log_every_n_steps=1",
        "trainer.val_every_n_steps=100000",
        "trainer.checkpoint_every_n_steps=100000",
        "trainer.export=false",
        "trainer.progress_bar=false",
        "trainer.plot=false",
        "generate.sample_prompts=[]",
        "parallel=zero3",
        "cluster.devices=2",
        "parallel.deepspeed_on_cpu=true",
        f"trainer.compile={mode}",
        f"trainer.compile_backend={args.backend}",
        f"hydra.run.dir={run_dir}",
    ]
    env = {**os.environ, "TORCH_LOGS": "recompiles,graph_breaks", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "tinytrain", *overrides], cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    log = r.stdout + r.stderr
    if r.returncode != 0:
        raise SystemExit(f"{mode} run failed ({r.returncode}):\n{log[-3000:]}")
    rank0 = [line for line in log.splitlines() if line.startswith("[rank0]")]
    with open(run_dir / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    losses = [float(row["loss"]) for row in rows if row.get("loss")]
    speeds = [float(row["tokens_per_s"]) for row in rows if row.get("tokens_per_s") and int(row["step"]) >= FIRST_TIMED_STEP]
    return {
        "mode": mode,
        "tokens_per_s": statistics.median(speeds),
        "graph_breaks": sum("Graph break" in line for line in rank0),
        "recompiles": sum("Recompiling function" in line for line in rank0),
        "losses": losses,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--backend", default="inductor")
    args = parser.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as root:
        for i in range(args.repeats):
            for mode in ("none", "blocks"):
                result = run(mode, args, Path(root) / f"{mode}{i}")
                runs.append(result)
                print(f"{mode:<6} run {i}: {result['tokens_per_s']:.0f} tokens/s per device, rank 0: {result['graph_breaks']} graph breaks, {result['recompiles']} recompiles", flush=True)
    eager = [r for r in runs if r["mode"] == "none"]
    base = eager[0]["losses"]
    for r in runs:
        r["loss_rel"] = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], base))
    speed = {mode: statistics.median(r["tokens_per_s"] for r in runs if r["mode"] == mode) for mode in ("none", "blocks")}
    print(f"\n{args.layers} layers, hidden {args.hidden}, seq {args.seq}, {args.steps} steps, ZeRO-3 on two CPU ranks, backend {args.backend}")
    print("| compile | tokens/s per device (median) | step time vs eager | graph breaks (rank 0) | recompiles (rank 0) | largest loss difference vs eager |")
    print("|---|---|---|---|---|---|")
    for mode in ("none", "blocks"):
        mine = [r for r in runs if r["mode"] == mode]
        print(f"| {mode} | {speed[mode]:.0f} | {speed['none'] / speed[mode]:.3f} | {max(r['graph_breaks'] for r in mine)} | {max(r['recompiles'] for r in mine)} | {max(r['loss_rel'] for r in mine):.1e} |")


if __name__ == "__main__":
    main()

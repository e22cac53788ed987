"""One command that proves the GPU path (run through benchmarks/gpu_check.sh).

On one NVIDIA GPU: TinyLlama-1.1B (seq 2048) trained ~30 steps with parallel=single, zero2 and
zero3 in bf16 (cluster.devices=1), and in fp16 with the loss-scale policy; packed-document
isolation on the real flash-attn kernel if importable; benchmarks/mfu.py with and without
torch.compile and liger-kernel. Prints one table.

`--dry-run` proves the script on a CPU in about a minute: a tiny model, a few steps, fp32 and fp16
(GradScaler on CPU), zero2 on DeepSpeed's CPU accelerator (parallel.deepspeed_on_cpu; zero3 is
left to tests/integration/test_deepspeed.py); compile and liger in mfu.py are skipped; isolation
uses the CPU stand-in kernel.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run(cmd: list[str], log: Path, timeout: int) -> int:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    with log.open("w") as out:
        try:
            return subprocess.run(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            return 124


def train_case(name: str, overrides: list[str], work: Path, timeout: int) -> dict:
    run_dir = work / name
    rc = run([sys.executable, "-m", "tinytrain", *overrides, f"hydra.run.dir={run_dir}"], work / f"{name}.log", timeout)
    row = {"check": f"train {name}", "status": "ok" if rc == 0 else f"FAILED (exit {rc}, see {name}.log)"}
    metrics = run_dir / "metrics.csv"
    if metrics.exists():
        with metrics.open(newline="") as f:
            rows = list(csv.DictReader(f))
        loss = [float(r["loss"]) for r in rows if r.get("loss")]
        tps = [float(r["tokens_per_s"]) for r in rows if r.get("tokens_per_s")]
        mfu = [float(r["mfu"]) for r in rows if r.get("mfu")]
        scale = [float(r["loss_scale"]) for r in rows if r.get("loss_scale")]
        if loss:
            row["loss"] = f"{loss[0]:.3f} -> {loss[-1]:.3f}"
            if rc == 0 and not loss[-1] < loss[0]:
                row["status"] = "FAILED (loss did not fall)"
        row["tokens/s"] = f"{statistics.median(tps):,.0f}" if tps else ""
        row["MFU"] = f"{100 * statistics.median(mfu):.1f}%" if mfu else ""
        row["note"] = f"loss scale {scale[0]:g} -> {scale[-1]:g}" if scale else ""
    plan = run_dir / "plan.json"
    if plan.exists():
        row["plan GiB"] = f"{json.loads(plan.read_text())['memory_per_gpu']['total_gib']:.1f}"
    export = run_dir / "hf_export"
    if rc == 0 and export.exists():
        check = "from transformers import AutoModelForCausalLM, AutoTokenizer; import sys; m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); assert m.get_input_embeddings().weight.shape[0] == len(AutoTokenizer.from_pretrained(sys.argv[1]))"
        ok = run([sys.executable, "-c", check, str(export)], work / f"{name}.export.log", 600) == 0
        row["note"] = (row.get("note", "") + "; " if row.get("note") else "") + ("export reloads" if ok else "EXPORT FAILED")
        if not ok:
            row["status"] = "FAILED (export)"
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dry-run", action="store_true", help="tiny model, a few steps, on a CPU")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--work", help="folder for the runs and logs (default: a temporary one)")
    args = parser.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu_check-"))
    work.mkdir(parents=True, exist_ok=True)
    gpu = not args.dry_run
    if gpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("gpu_check: no CUDA GPU visible; --dry-run checks the script on a CPU")
        steps, timeout = args.steps, 600
        common = ["model=tinyllama_1b", "data.seq_len=2048", "trainer.micro_batch_size=4", "cluster.devices=1"]
    else:
        steps, timeout = 4, 300
        common = ["model=tiny", "data.seq_len=64", "trainer.micro_batch_size=2"]
    common += [f"trainer.max_steps={steps}", "trainer.warmup_steps=2", "trainer.log_every_n_steps=1", "trainer.val_every_n_steps=100000",
               "trainer.checkpoint_every_n_steps=100000", "trainer.progress_bar=false", "trainer.plot=false", "trainer.lr=1e-3"]
    rows = []
    deepspeed = [] if gpu else ["parallel.deepspeed_on_cpu=true"]
    cases = [("single_bf16" if gpu else "single_fp32", ["parallel=single"], True),
             ("zero2_bf16" if gpu else "zero2_fp32", ["parallel=zero2", "trainer.export=false", *deepspeed], True),
             ("zero3_bf16", ["parallel=zero3", "trainer.export=false"], gpu),
             ("single_fp16", ["parallel=single", "precision=fp16", "precision.loss_scale.initial_scale_power=12", "trainer.export=false"], True)]
    for name, overrides, runs in cases:
        if runs:
            rows.append(train_case(name, common + overrides, work, timeout))
            print(f"  {rows[-1]['check']}: {rows[-1]['status']}", flush=True)
        else:
            rows.append({"check": f"train {name}", "status": "skipped (dry run: zero2 shows the DeepSpeed path on CPU)"})

    iso = work / "isolation.json"
    rc = run([sys.executable, "benchmarks/flash_isolation.py", "--json", str(iso)], work / "isolation.log", timeout)
    row = {"check": "flash-attn packing isolation", "status": "ok" if rc == 0 else f"FAILED (exit {rc}, see isolation.log)"}
    if iso.exists():
        r = json.loads(iso.read_text())
        row["note"] = f"{r['kernel']}: max |packed - alone| " + ", ".join(f"{k} {v:.2g}" for k, v in r["max_abs_diff"].items())
    rows.append(row)

    liger = importlib.util.find_spec("liger_kernel") is not None
    variants = [("plain", [])]
    if gpu:
        variants += [("compile", ["--compile"])] + ([("liger", ["--liger"]), ("compile+liger", ["--compile", "--liger"])] if liger else [])
    mfu_args = ["--steps", str(10 if gpu else 3), "--warmup", str(3 if gpu else 1)] + ([] if gpu else ["--tiny"])
    for name, extra in variants:
        out = work / f"mfu_{name}.json"
        rc = run([sys.executable, "benchmarks/mfu.py", *mfu_args, *extra, "--json", str(out)], work / f"mfu_{name}.log", timeout)
        row = {"check": f"mfu.py {name}", "status": "ok" if rc == 0 and out.exists() else f"FAILED (exit {rc}, see mfu_{name}.log)"}
        if out.exists():
            r = json.loads(out.read_text())
            row["tokens/s"] = f"{r['tinytrain_tokens_per_s']:,.0f} (raw {r['raw_tokens_per_s']:,.0f})"
            row["MFU"] = f"{100 * r['tinytrain_mfu']:.1f}% (raw {100 * r['raw_mfu']:.1f}%)" if r["tinytrain_mfu"] else "omitted on CPU"
            row["note"] = f"raw/tinytrain step time {r['ratio']:.3f}; {r['attention']}" + (f"; peak {r['peak_memory_gib']:.1f} GiB" if r["peak_memory_gib"] else "")
        rows.append(row)
    if not gpu:
        rows.append({"check": "mfu.py compile / liger", "status": "skipped (dry run: compile on a CPU takes minutes; liger needs CUDA)"})
    elif not liger:
        rows.append({"check": "mfu.py liger", "status": "skipped (liger-kernel not installed: carry its wheel, benchmarks/README.md)"})

    columns = ["check", "status", "loss", "tokens/s", "MFU", "plan GiB", "note"]
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in columns}
    print(f"\ngpu_check ({'dry run on CPU' if not gpu else 'GPU'}; runs and logs in {work})")
    print(" | ".join(c.ljust(widths[c]) for c in columns))
    print("-+-".join("-" * widths[c] for c in columns))
    for r in rows:
        print(" | ".join(str(r.get(c, "")).ljust(widths[c]) for c in columns))
    raise SystemExit(1 if any(r["status"].startswith("FAILED") for r in rows) else 0)


if __name__ == "__main__":
    main()

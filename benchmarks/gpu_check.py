"""The GPU path in parts that each fit a short lease (run through benchmarks/gpu_check.sh).

On one NVIDIA GPU, each part in <= 8 minutes of an H100 with its imports:
  headline  the MFU table in one lease: benchmarks/mfu.py TinyLlama-1.1B seq 2048 bf16 on packed
     documents, tinytrain vs the raw loop on the same varlen kernel, with selective activation
     checkpointing and per-block compile off and on (peak memory of each against the plan's
     estimate), and packed-document isolation on the real varlen kernel; last, on Hopper and newer,
     float8 linears (torchao) with per-block compile. Run it first.
  a  packed-document isolation on the real kernels (torch varlen, SDPA; flash-attn where installed)
     and a 30-step bf16 single-GPU TinyLlama-1.1B run (seq 2048) with its export reloaded
  b  DeepSpeed zero2 and zero3 in bf16 (zero3 also with compiled blocks), and zero2 in fp16 with the
     loss-scale policy (1 GPU each)
  c  benchmarks/mfu.py TinyLlama-1.1B seq 2048 bf16, tinytrain vs the raw loop on the same attention
     kernel: plain, --compile, --liger, and packed rows one per micro batch, 8 per optimizer step
  d  peak GPU memory of single / zero2 / zero3 at mfu.py's batch (8 x 2048) against the plan's estimate
  e  ring context parallel (torch's, flex-attention path; model/ring_attention.py) at cp 2: the loss,
     every token's logits and every gradient against whole sequences (tests/integration/ring_worker.py),
     one rank per GPU over nccl: needs 2 GPUs (both ranks on one GPU over gloo crashed, SIGSEGV, on
     an H100 with torch 2.11; nccl refuses two ranks on one device). On a GPU the kernel is compiled
     flex attention, whose gradients the CPU cannot check (torch 2.13 has no flex-attention backward
     on CPU: ring trains there with SDPA over the same block mask).
  f  long context on one GPU (benchmarks/long_context_layer.py): one Llama-3-8B layer in bf16 at 32k,
     64k and 128k tokens on torch's varlen kernel and on SDPA's flash: what it keeps for backward
     against the plan's count (plan/activations.py), its peak in backward against the plan's count of a
     checkpointed layer's recompute, its time and TFLOP/s
Every part appends its rows to OUT/gpu_check.json and rewrites OUT/gpu_check.md (the table, with
device, date and versions per part) from all rows there, so a later part or a later lease continues
the table; a part run again replaces its own rows. Each training run records its peak GPU memory
(benchmarks/peak_memory.py) beside the plan's estimate.

`--dry-run` proves a part on a CPU: a tiny model, a few steps, fp32 / fp16 (GradScaler or DeepSpeed's
loss scaler on its CPU accelerator); the CUDA kernels are their pure-torch references; compile,
liger, zero3 and the memory layouts beyond one are reported as skipped.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import importlib.metadata
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PARTS = ("headline", "a", "b", "c", "d", "e", "f")
COLUMNS = ["part", "check", "status", "loss", "tokens/s", "MFU", "peak GiB", "plan GiB", "note"]
RESULTS = "gpu_check.json"
BUDGET_S = 450  # of the 8 minutes a part may take on one H100: the rest is imports and the wheels' install
# The training parts' text: data=text's default (../shared/data beside the checkout), or a copy
# inside the checkout, since a GPU machine gets the checkout alone.
SHARED_TEXT = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
CARRIED_TEXT = REPO / "benchmarks" / ".data" / "tinyshakespeare.txt"
TRAINING_PARTS = ("a", "b", "d")


class Part:
    """One part's runs: a work folder, a deadline every subprocess shares, the rows it makes."""

    def __init__(self, name: str, out: Path, gpu: bool, budget: float):
        self.name, self.gpu = name, gpu
        self.work = out / f"part_{name}"
        self.work.mkdir(parents=True, exist_ok=True)
        self.deadline = time.monotonic() + budget
        self.rows: list[dict] = []

    def run(self, cmd: list[str], log: str, limit: int = 600) -> int:
        left = int(self.deadline - time.monotonic())
        if left < 20:
            return -1
        with (self.work / log).open("w") as out:
            try:
                return subprocess.run(cmd, cwd=REPO, stdout=out, stderr=subprocess.STDOUT, timeout=min(limit, left)).returncode
            except subprocess.TimeoutExpired:
                return 124

    def add(self, row: dict) -> None:
        self.rows.append({"part": self.name, **row})
        print(f"  {row['check']}: {row['status']}", flush=True)


def status(rc: int, log: str) -> str:
    if rc == 0:
        return "ok"
    if rc == -1:
        return "not run (the part's time was spent: run the part again)"
    return f"FAILED (exit {rc}{', timed out' if rc == 124 else ''}, see {log})"


def train(part: Part, name: str, overrides: list[str], export: bool) -> None:
    """A tinytrain run; its loss, tokens/s, MFU, loss scale, peak memory against the plan's, export."""
    run_dir, peak = part.work / name, part.work / f"{name}.peak.json"
    overrides = [*overrides, f"hydra.run.dir={run_dir}"] + ([] if export else ["trainer.export=false"])
    rc = part.run([sys.executable, "benchmarks/peak_memory.py", str(peak), *overrides], f"{name}.log")
    row = {"check": f"train {name}", "status": status(rc, f"part_{part.name}/{name}.log")}
    metrics = run_dir / "metrics.csv"
    if metrics.exists():
        with metrics.open(newline="") as f:
            rows = list(csv.DictReader(f))
        loss, tps, mfu, scale = ([float(r[key]) for r in rows if r.get(key)] for key in ("loss", "tokens_per_s", "mfu", "loss_scale"))
        if loss:
            row["loss"] = f"{loss[0]:.3f} -> {loss[-1]:.3f}"
            if rc == 0 and len(loss) > 5 and not loss[-1] < loss[0]:
                row["status"] = "FAILED (loss did not fall)"
        row["tokens/s"] = f"{statistics.median(tps):,.0f}" if tps else ""
        row["MFU"] = f"{100 * statistics.median(mfu):.1f}%" if mfu else ""
        row["note"] = f"loss scale {scale[0]:g} -> {scale[-1]:g}" if scale else ""
    plan = run_dir / "plan.json"
    if plan.exists():
        planned = json.loads(plan.read_text())
        row["plan GiB"] = f"{planned['memory_per_gpu']['total_gib']:.1f}"
        row["note"] = "; ".join(x for x in (row.get("note"), f"attention {planned['model']['attention']}") if x)
    if peak.exists():
        measured = json.loads(peak.read_text())
        if "allocated_gib" in measured:
            row["peak GiB"] = f"{measured['allocated_gib']:.1f} (reserved {measured['reserved_gib']:.1f})"
        if plan.exists() and planned.get("host_memory"):  # one process: the plan's per-node peak is its own
            host = f"host {measured['host_gib']:.1f} GiB (plan {planned['host_memory']['peak_bytes'] / 2**30:.1f})"
            row["note"] = "; ".join(x for x in (row.get("note"), host) if x)
    if export and rc == 0:
        check = "from transformers import AutoModelForCausalLM, AutoTokenizer; import sys; m = AutoModelForCausalLM.from_pretrained(sys.argv[1]); assert m.get_input_embeddings().weight.shape[0] == len(AutoTokenizer.from_pretrained(sys.argv[1]))"
        ok = part.run([sys.executable, "-c", check, str(run_dir / "hf_export")], f"{name}.export.log") == 0
        row["note"] = "; ".join(x for x in (row.get("note"), "export reloads" if ok else "EXPORT FAILED") if x)
        if not ok:
            row["status"] = "FAILED (export)"
    part.add(row)


def corpus() -> list[str]:
    """The data override of the training runs: none where data=text's default is there, else the
    copy carried inside the checkout (main() has checked one of them exists)."""
    return [] if SHARED_TEXT.exists() else [f"data.path={CARRIED_TEXT}"]


def common(gpu: bool, steps: int, micro: int) -> list[str]:
    model = ["model=tinyllama_1b", "data.seq_len=2048", "cluster.devices=1"] if gpu else ["model=tiny", "data.seq_len=64"]
    return [*model, *corpus(), f"trainer.micro_batch_size={micro if gpu else 2}", f"trainer.max_steps={steps}", "trainer.warmup_steps=2", "trainer.log_every_n_steps=1",
            "trainer.val_every_n_steps=100000", "trainer.checkpoint_every_n_steps=100000", "trainer.progress_bar=false", "trainer.plot=false", "trainer.lr=1e-3"]


def isolation(part: Part, kernel: str) -> None:
    out = part.work / f"isolation_{kernel}.json"
    rc = part.run([sys.executable, "benchmarks/packed_isolation.py", "--kernel", kernel, "--json", str(out)] + ([] if part.gpu else ["--reference"]), f"isolation_{kernel}.log", 180)
    row = {"check": f"packed isolation {kernel}", "status": status(rc, f"part_{part.name}/isolation_{kernel}.log")}
    if out.exists():
        r = json.loads(out.read_text())
        row["note"] = f"{r['kernel']}: max |packed - alone| " + ", ".join(f"{k} {v:.2g}" for k, v in r["max_abs_diff"].items()) + f" (tolerance {r['tolerance']:g})"
    part.add(row)


def part_a(part: Part) -> None:
    for kernel in ["varlen", "sdpa"] + (["flash"] if part.gpu and importlib.util.find_spec("flash_attn") else []):
        isolation(part, kernel)
    steps = 30 if part.gpu else 4
    train(part, "single_bf16" if part.gpu else "single_fp32", common(part.gpu, steps, 4) + ["parallel=single"], export=True)


def part_b(part: Part) -> None:
    steps = 30 if part.gpu else 4
    deepspeed = [] if part.gpu else ["parallel.deepspeed_on_cpu=true"]
    fp16 = ["precision=fp16", "precision.loss_scale.initial_scale_power=12"]
    if part.gpu:
        train(part, "zero2_bf16", common(True, steps, 4) + ["parallel=zero2"], export=False)
        train(part, "zero3_bf16", common(True, steps, 4) + ["parallel=zero3"], export=False)
        # compiled blocks inside ZeRO-3's hooks (each layer gathered whole): its tokens/s against the row above
        train(part, "zero3_bf16_blocks", common(True, steps, 4) + ["parallel=zero3", "trainer.compile=blocks"], export=False)
    else:
        part.add({"check": "train zero2_bf16 / zero3_bf16", "status": "skipped (dry run: zero2 fp16 below shows the DeepSpeed path on a CPU)"})
    train(part, "zero2_fp16", common(part.gpu, steps, 4) + ["parallel=zero2", *fp16, *deepspeed], export=False)


def mfu(part: Part, name: str, args: list[str], limit: int = 600, profile: bool = False) -> None:
    """A benchmarks/mfu.py run as a row: tokens/s and MFU of tinytrain and the raw loop, peak memory
    of the tinytrain side against the plan's estimate."""
    file = name.replace(" + ", "_").replace(" ", "_")
    out = part.work / f"mfu_{file}.json"
    ops = part.work / f"mfu_{file}.ops.txt"
    rc = part.run([sys.executable, "benchmarks/mfu.py", *args, "--json", str(out), *(["--profile", str(ops)] if profile else [])], f"mfu_{file}.log", limit)
    row = {"check": f"mfu.py {name}", "status": status(rc, f"part_{part.name}/mfu_{file}.log") if rc != 0 or out.exists() else "FAILED (no figures)"}
    if out.exists():
        r = json.loads(out.read_text())
        row["tokens/s"] = f"{r['tinytrain_tokens_per_s']:,.0f} (raw {r['raw_tokens_per_s']:,.0f})"
        row["MFU"] = f"{100 * r['tinytrain_mfu']:.1f}% (raw {100 * r['raw_mfu']:.1f}%)" if r["tinytrain_mfu"] else "omitted on CPU"
        if r["peak_memory_gib"]:
            row["peak GiB"] = f"{r['peak_memory_gib']:.1f} (raw {r['raw_peak_memory_gib']:.1f})"
        row["plan GiB"] = f"{r['plan_memory_gib']:.1f}"
        row["note"] = f"raw/tinytrain step time {r['ratio']:.3f}; attention {r['attention']}; batch {r['batch']}{' packed' if r['packed'] else ''}"
        if r.get("profile_top"):
            row["note"] += "; top: " + ", ".join(f"{t['op']} {100 * t['share']:.0f}%" for t in r["profile_top"][:4])
    part.add(row)


def fp8_capable() -> bool:
    import torch

    return torch.cuda.get_device_capability(0) >= (8, 9) and importlib.util.find_spec("torchao") is not None


def part_headline(part: Part) -> None:
    """The plain run first (the figure that matters most), then each lever on its own, isolation,
    then the levers together (what a short lease leaves out comes last)."""
    steps = ["--steps", "10", "--warmup", "4"] if part.gpu else ["--steps", "3", "--warmup", "1", "--tiny"]
    mfu(part, "packed", [*steps, "--packed"], limit=240, profile=True)  # below the target MFU: where the time goes
    mfu(part, "packed + selective", [*steps, "--packed", "--checkpointing", "selective"], limit=240)
    if part.gpu:
        mfu(part, "packed + blocks", [*steps, "--packed", "--compile", "blocks"], limit=300)
    isolation(part, "varlen")
    if part.gpu:
        mfu(part, "packed + selective + blocks", [*steps, "--packed", "--checkpointing", "selective", "--compile", "blocks"], limit=300)
        if fp8_capable():
            mfu(part, "packed + fp8 + blocks", [*steps, "--packed", "--fp8", "--compile", "blocks"], limit=300)
    else:
        part.add({"check": "mfu.py packed + blocks / + selective + blocks", "status": "skipped (dry run: compile on a CPU takes minutes)"})


def part_c(part: Part) -> None:
    liger = importlib.util.find_spec("liger_kernel") is not None
    variants = [("plain", [])] + ([("compile", ["--compile"])] + ([("liger", ["--liger"])] if liger else []) if part.gpu else [])
    mfu_args = ["--steps", "10", "--warmup", "3"] if part.gpu else ["--steps", "3", "--warmup", "1", "--tiny"]
    # The long-context shape: one row per micro batch, 8 per optimizer step. tinytrain reads nothing
    # back from the GPU between them (tests/integration/test_host_reads.py), as the raw loop doesn't.
    variants.append(("packed micro 1 x 8", ["--packed", "--micro-batch", "1", "--accumulation", "8" if part.gpu else "2"]))
    for name, extra in variants:
        mfu(part, name, [*mfu_args, *extra])
    if not part.gpu:
        part.add({"check": "mfu.py compile / liger", "status": "skipped (dry run: compile on a CPU takes minutes; liger needs CUDA)"})
    elif not liger:
        part.add({"check": "mfu.py liger", "status": "skipped (liger-kernel not installed: benchmarks/gpu_wheels.sh)"})


def part_d(part: Part) -> None:
    layouts = ["single", "zero2", "zero3"] if part.gpu else ["single"]
    for layout in layouts:
        train(part, f"memory_{layout}_mb8", common(part.gpu, 4, 8) + [f"parallel={layout}"], export=False)
    if not part.gpu:
        part.add({"check": "train memory_zero2_mb8 / memory_zero3_mb8", "status": "skipped (dry run: no GPU memory to measure)"})


def part_e(part: Part) -> None:
    import torch

    gpus = torch.cuda.device_count() if part.gpu else 0
    if part.gpu and gpus < 2:
        # Both ranks on one GPU over gloo: each rank died of SIGSEGV in the ring's first collective
        # (torch 2.11, H100, 2026-11-27); nccl refuses two ranks on one device.
        part.add({"check": "ring cp 2", "status": "skipped (needs 2 GPUs: gloo with CUDA tensors crashed in the ring's collectives on one GPU, nccl refuses two ranks on one device)"})
        return
    if not part.gpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the dry run: two CPU ranks over gloo (SDPA over the block mask)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "tests.integration.ring_worker", "2", str(part.work)]
    rc = part.run(cmd, "ring_cp2.log")
    how = "2 GPUs, nccl" if gpus else "2 CPU ranks, gloo"
    row = {"check": f"ring cp 2 ({how})", "status": status(rc, "part_e/ring_cp2.log")}
    result = part.work / "ring_cp2_tp1_world2.pt"
    if result.exists():
        ranks = torch.load(result, weights_only=False)["ranks"]
        loss_gap, logits_gap = max(r["loss_gap"] for r in ranks), max(r["logits_gap"] for r in ranks)
        grad_gap = max(r["grad_gap"] for r in ranks)
        row["note"] = f"vs whole sequences: loss {loss_gap:.2g}, logits {logits_gap:.2g}; worst gradient {grad_gap:.2g} (relative)"
        if rc == 0 and (loss_gap > 1e-5 or logits_gap > 1e-4 or grad_gap > 1e-4):
            row["status"] = "FAILED (ring differs from whole sequences)"
    part.add(row)


# The layer's kept bytes (and its peak in backward) may exceed the plan's count by this much before
# the row fails: the allocator's rounding and a kernel's own buffers (the count was measured on a CPU).
KEPT_OVER_PLAN = 1.10


def part_f(part: Part) -> None:
    out = part.work / "long_context_layer.json"
    rc = part.run([sys.executable, "benchmarks/long_context_layer.py", "--json", str(out)] + ([] if part.gpu else ["--tiny"]), "long_context_layer.log")
    if not out.exists():
        part.add({"check": "long-context layer", "status": status(rc, "part_f/long_context_layer.log") if rc != 0 else "FAILED (no figures)"})
        return
    for r in json.loads(out.read_text())["rows"]:
        row = {"check": f"layer {r['kernel']} {r['seq'] / 1024:g}k"}
        if "error" in r:
            row["status"] = f"FAILED ({r['error']})"
        else:
            # On a CPU the varlen stand-in is pure torch and keeps its scores: only a GPU's kernels are held to the count.
            over = [f"{what} {r[key]:.2f}x the plan's count" for what, key in (("kept", "kept_over_plan"), ("peak", "peak_over_plan")) if part.gpu and r[key] > KEPT_OVER_PLAN]
            row["status"] = f"FAILED ({'; '.join(over)})" if over else "ok"
            row["tokens/s"] = f"{r['seq'] / r['seconds']:,.0f}"
            row["peak GiB"] = f"{r['peak_gib']:.1f}"
            row["plan GiB"] = f"{r['plan_gib']:.1f} kept, {r['plan_peak_gib']:.1f} peak"
            row["note"] = f"kept {r['kept_gib']:.2f} GiB = {r['kept_over_plan']:.2f}x the plan's count, peak {r['peak_over_plan']:.2f}x (the recompute's); {r['tflops']:.3g} TFLOP/s; attention {r['attention']}"
        part.add(row)


def versions() -> str:
    found = []
    for dist in ("torch", "transformers", "lightning", "deepspeed", "liger-kernel", "flash-attn"):
        try:
            found.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


def device(gpu: bool) -> str:
    if not gpu:
        return "CPU (dry run)"
    import torch

    major, minor = torch.cuda.get_device_capability(0)
    return f"{torch.cuda.get_device_name(0)} (compute capability {major}.{minor}, CUDA {torch.version.cuda})"


def save(out: Path, part: Part, header: dict) -> list[dict]:
    """Merge this part's rows into OUT/gpu_check.json (replacing its own from an earlier run) and
    rewrite OUT/gpu_check.md from all of them."""
    path = out / RESULTS
    results = json.loads(path.read_text()) if path.exists() else {"parts": {}, "rows": []}
    results["parts"][part.name] = header
    results["rows"] = [r for r in results["rows"] if r["part"] != part.name] + part.rows
    results["rows"].sort(key=lambda r: r["part"])
    path.write_text(json.dumps(results, indent=2))
    lines = ["# gpu_check", ""]
    lines += [f"- part {p}: {h['date']}, {h['device']}; {h['versions']}" for p, h in sorted(results["parts"].items())]
    lines += ["", "| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(str(r.get(c, "")).replace("|", "/") for c in COLUMNS) + " |" for r in results["rows"]]
    (out / "gpu_check.md").write_text("\n".join(lines) + "\n")
    return results["rows"]


def main() -> None:
    parser = argparse.ArgumentParser(description="the GPU path in parts (benchmarks/gpu_check.sh)")
    parser.add_argument("--part", required=True, help="headline, a, b, c, d, e or f (see this file's docstring)")
    parser.add_argument("--out", required=True, help="folder of the results file the parts share (gpu_check.json / .md) and the runs' logs")
    parser.add_argument("--dry-run", action="store_true", help="tiny model, a few steps, on a CPU")
    parser.add_argument("--budget", type=float, default=BUDGET_S, help="seconds the part's runs may take in all")
    args = parser.parse_args()
    if Path(args.out).exists() and not Path(args.out).is_dir():
        print(f"gpu_check: --out {args.out} is a file; it names the folder the parts share (gpu_check.json, gpu_check.md, the runs' logs). Fix: give a folder path, new or from an earlier part (e.g. --out {args.out}.d), or move the file away", file=sys.stderr)
        sys.exit(2)
    if args.part not in PARTS:
        raise SystemExit(f"gpu_check: --part {args.part!r} is not a part: use one of {', '.join(PARTS)} (headline: the MFU table, run it first; a: isolation + bf16 run, b: DeepSpeed, c: mfu.py, d: memory, e: ring, f: long-context layer)")
    # What the parts import that a bare GPU image lacks: a clear stop instead of a log full of ImportErrors.
    needed = {"hydra": "hydra-core", "omegaconf": "omegaconf"} | ({"deepspeed": "deepspeed"} if args.part in "bd" else {})
    missing = [dist for module, dist in needed.items() if importlib.util.find_spec(module) is None]
    if missing:
        raise SystemExit(f"gpu_check: {', '.join(missing)} not importable: carry the wheels (bash benchmarks/gpu_wheels.sh DIR on a machine with PyPI, then gpu_check.sh --wheels DIR)")
    if args.part in TRAINING_PARTS and not SHARED_TEXT.exists() and not CARRIED_TEXT.exists():
        print(
            f"gpu_check: part {args.part} trains on tinyshakespeare, and neither ../shared/data (beside the checkout) nor benchmarks/.data holds it: "
            "a GPU machine gets the checkout alone. Fix: here, `mkdir -p benchmarks/.data && cp ../shared/data/tinyshakespeare.txt benchmarks/.data/`, and carry benchmarks/.data",
            file=sys.stderr,
        )
        sys.exit(2)
    gpu = not args.dry_run
    if gpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("gpu_check: no CUDA GPU visible; --dry-run checks the script on a CPU")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.environ["PYTHONPATH"] = os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x)
    part = Part(args.part, out, gpu, args.budget)
    header = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "device": device(gpu), "versions": versions()}
    print(f"gpu_check part {args.part} ({header['device']}; {header['versions']})", flush=True)
    {"headline": part_headline, "a": part_a, "b": part_b, "c": part_c, "d": part_d, "e": part_e, "f": part_f}[args.part](part)
    rows = save(out, part, header)
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in COLUMNS}
    print(f"\ngpu_check ({'dry run on CPU' if not gpu else 'GPU'}; results in {out / RESULTS}, table in {out / 'gpu_check.md'})")
    print(" | ".join(c.ljust(widths[c]) for c in COLUMNS))
    print("-+-".join("-" * widths[c] for c in COLUMNS))
    for r in rows:
        print(" | ".join(str(r.get(c, "")).ljust(widths[c]) for c in COLUMNS))
    raise SystemExit(1 if any(r["status"].startswith(("FAILED", "not run")) for r in part.rows) else 0)


if __name__ == "__main__":
    main()

"""The throughput levers side by side: activation checkpointing none / full / selective and
torch.compile eager / blocks (/ model with --all), each as a fresh process on the same model, batch
and seed, through tinytrain's own code (tinytrain.model.activation_checkpointing and
tinytrain.model.compile). Printed as ratios to none (checkpointing) and eager (compile):

- step time: median of forward + backward + AdamW step over --steps steps after --warmup;
- peak memory of a step: CUDA's max_memory_allocated on a GPU; on CPU the process's peak RSS
  (VmHWM, reset before the timed steps) minus its RSS before them: activations and transients;
- gradients of the first batch against the baseline's, max absolute difference (fp32).

    python benchmarks/throughput_levers.py [--layers 8 --hidden 768 --batch 2 --seq 256] [--all]
Expect: full's memory well below none's at ~4/3 of its step time; selective between them at
close to none's time; blocks' gradients equal to eager's within 1e-6 under aot_eager, its step
faster than eager's under inductor once compiled (compile time is reported apart). --all adds full
with compiled blocks twice: the checkpoint around each block's compiled forward (what tinytrain
runs, tinytrain/model/compile.py) and inside its graph (where transformers 5.23 puts it).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHECKPOINTING = ("none", "full", "selective")


def rss_mb(key: str = "VmRSS:") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
    return 0.0


def reset_peak() -> None:
    """Linux: writing 5 to clear_refs resets VmHWM (the peak RSS) to the current RSS."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def child(args) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from tinytrain.model.activation_checkpointing import apply_checkpointing
    from tinytrain.model.compile import apply_compile

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 64 * 64, num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64, num_key_value_heads=args.hidden // 128, use_cache=False, attn_implementation="sdpa")
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = LlamaForCausalLM(config).to(device).train()
    apply_checkpointing(model, args.checkpointing)
    if args.checkpoint_in_graph:  # where transformers 5.23 puts a whole block's checkpoint; tinytrain puts it around the graph
        import tinytrain.model.compile

        tinytrain.model.compile.checkpoints_in_forward = lambda: False
    apply_compile(model, args.compile, args.backend)
    g = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, args.vocab, (args.batch, args.seq), generator=g).to(device) for _ in range(args.warmup + args.steps)]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step(ids) -> None:
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    start = time.perf_counter()
    model(input_ids=batches[0], labels=batches[0]).loss.backward()  # the first batch's gradients, before any update
    first = time.perf_counter() - start  # includes compilation
    grads = {n: p.grad.detach().cpu() for n, p in model.named_parameters()}
    torch.save(grads, args.grads)
    opt.step()
    opt.zero_grad(set_to_none=True)
    for ids in batches[1 : args.warmup]:
        step(ids)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated() / 2**20
    else:
        base = rss_mb()
        reset_peak()
    times = []
    for ids in batches[args.warmup :]:
        t = time.perf_counter()
        step(ids)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else rss_mb("VmHWM:")
    params_mb = sum(p.numel() * p.element_size() for p in model.parameters()) / 2**20
    return {"step_s": statistics.median(times), "peak_mb": peak - base, "first_s": first, "params_mb": params_mb, "device": str(device), "threads": torch.get_num_threads()}


def run(variant: dict, shape: list[str], folder: Path) -> dict:
    name = f"checkpointing={variant['checkpointing']} compile={variant['compile']}" + (f" ({variant['backend']})" if variant["compile"] != "none" else "") + (" in graph" if variant.get("checkpoint_in_graph") else "")
    grads = folder / f"{len(list(folder.iterdir()))}.pt"
    cmd = [sys.executable, __file__, "--child", "--grads", str(grads), *shape, *(f"--{k}={v}" for k, v in variant.items())]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if r.returncode != 0:
        raise SystemExit(f"{name} failed:\n{r.stderr[-3000:]}")
    return {**json.loads(r.stdout.strip().splitlines()[-1]), "name": name, "grads": grads}


def max_difference(a: Path, b: Path) -> float:
    import torch

    ga, gb = torch.load(a), torch.load(b)
    return max(float((ga[n] - gb[n]).abs().max()) for n in ga)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=768)
    parser.add_argument("--vocab", type=int, default=16384)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--all", action="store_true", help="also compile=model, blocks under aot_eager, and full + blocks with the checkpoint around the graph and in it")
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--grads", type=str)
    parser.add_argument("--checkpointing", default="none")
    parser.add_argument("--compile", default="none")
    parser.add_argument("--backend", default="inductor")
    parser.add_argument("--checkpoint_in_graph", type=int, default=0)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    shape = [f"--{k}={getattr(args, k)}" for k in ("layers", "hidden", "vocab", "batch", "seq", "steps", "warmup")]
    with tempfile.TemporaryDirectory() as folder:
        levers = [{"checkpointing": m, "compile": "none", "backend": "inductor"} for m in CHECKPOINTING]
        levers += [{"checkpointing": "none", "compile": "blocks", "backend": "inductor"}]
        if args.all:
            levers += [{"checkpointing": "none", "compile": "blocks", "backend": "aot_eager"}, {"checkpointing": "none", "compile": "model", "backend": "inductor"}]
            levers += [{"checkpointing": "full", "compile": "blocks", "backend": "inductor"}, {"checkpointing": "full", "compile": "blocks", "backend": "inductor", "checkpoint_in_graph": 1}]
        results = [run(v, shape, Path(folder)) for v in levers]
        base = results[0]
        print(f"model {args.layers} layers x hidden {args.hidden}, vocab {args.vocab}: {base['params_mb']:.0f} MB of fp32 weights; batch {args.batch}x{args.seq}; {args.steps} timed steps after {args.warmup} on {base['device']} ({base['threads']} threads)")
        print(f"{'variant':<56} {'step':>9} {'x base':>7} {'peak MB':>9} {'x base':>7} {'first step':>11} {'max |grad - base|':>18}")
        for r in results:
            diff = max_difference(r["grads"], base["grads"])
            print(f"{r['name']:<56} {r['step_s']:8.3f}s {r['step_s'] / base['step_s']:7.2f} {r['peak_mb']:9.1f} {r['peak_mb'] / base['peak_mb']:7.2f} {r['first_s']:10.1f}s {diff:18.2e}{'' if diff <= 1e-6 else '  (> 1e-6)'}")


if __name__ == "__main__":
    main()

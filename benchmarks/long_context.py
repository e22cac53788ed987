"""Context parallelism on this machine: activation memory per rank and step time, seq_len x cp.

    python benchmarks/long_context.py [--seq 1024,2048,4096] [--cp 1,2,4] [--repeats 3] [--kind ulysses|ring]

For each sequence length and cp (world = cp, dp 1: the same global tokens at every cp), cp
processes over gloo run tinytrain's Ulysses path (model/context_parallel.py: DeepSpeed's
UlyssesSPAttentionHF, the batch split by ContextGroup, the loss reduced over the group), or with
--kind ring its ring path (model/ring_attention.py: torch's context parallel, keys and values
gathered over the group, on a CPU SDPA over the block mask), on a Llama of ~30M parameters with
packed documents of 512 tokens. Per rank it measures the bytes of
the tensors autograd saves for backward, weights excluded (the activations, which is what cp divides) and the
time of a forward and backward; it prints both as ratios to cp=1 at the same length, with the
plan's formula (plan/memory.py) beside the measured memory. On a 2-core machine cp=4 runs 4
processes on 2 cores, so its time ratio measures oversubscription as much as cp.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SHAPE = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, vocab_size=4096)
DOCUMENT = 512
ROWS = 1


def worker(cp: int, seq: int, repeats: int, out: Path, kind: str = "ulysses") -> None:
    import torch
    import torch.distributed as dist
    from transformers import LlamaConfig, LlamaForCausalLM

    from tinytrain.model.context_parallel import ContextGroup, enable_ulysses
    from tinytrain.model.module import causal_lm_loss

    rank = int(os.environ["RANK"])
    if cp > 1:
        dist.init_process_group("gloo", rank=rank, world_size=cp)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE, max_position_embeddings=seq, attn_implementation="sdpa"))
    if cp == 1:
        context = ContextGroup(1, 0, None, ROWS)
    elif kind == "ring":
        from tinytrain.model.ring_attention import enable_ring_on

        context = enable_ring_on(model, "cpu", cp, cp=cp, tp=1)
    else:
        import deepspeed

        deepspeed.init_distributed(dist_backend="gloo")
        context = enable_ulysses(model, cp=cp, micro_batch_size=ROWS)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, SHAPE["vocab_size"], (ROWS, seq), generator=g)
    batch = {"input_ids": ids, "position_ids": (torch.arange(seq) % DOCUMENT).expand(ROWS, seq), "labels": ids.roll(-1, 1)}
    local = context.shard(batch)
    saved = [0]
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}

    counted: set = set()

    def pack(t):
        # Activations only (autograd also saves references to the weights a matmul needs), each
        # storage once (a tensor saved by several ops, e.g. a mask shared by the layers, is held once).
        ptr = t.untyped_storage().data_ptr()
        if ptr not in weights and ptr not in counted:
            counted.add(ptr)
            saved[0] += t.untyped_storage().nbytes()
        return t

    def step(measure: bool) -> float:
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(pack if measure else (lambda t: t), lambda t: t):
            logits = model(**context.model_kwargs(local["input_ids"], local.get("attention_mask"), local["position_ids"])).logits
            loss = causal_lm_loss(logits, local["labels"], SHAPE["vocab_size"])
            if cp > 1:
                loss = context.mean_loss(loss, local["labels"])
        loss.backward()
        model.zero_grad(set_to_none=True)
        counted.clear()
        return time.perf_counter() - start

    step(False)  # warm-up
    times = [step(i == 0) for i in range(repeats)]
    if rank == 0:
        out.write_text(json.dumps({"saved_bytes": saved[0], "seconds": min(times)}))
    if cp > 1:
        dist.destroy_process_group()


def run(cp: int, seq: int, repeats: int, kind: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "result.json"
        port = 29500 + (os.getpid() + 7 * seq + cp) % 2000
        env = {**os.environ, "WORLD_SIZE": str(cp), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
        cmd = [sys.executable, __file__, "--worker", str(cp), str(seq), str(repeats), str(out), kind]
        procs = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(cp)]
        logs = [p.communicate(timeout=1800)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit("\n".join(log[-2000:] for log in logs))
        return json.loads(out.read_text())


def planned(seq: int, cp: int, kind: str) -> float:
    from transformers import LlamaConfig

    from tinytrain.plan.activations import Layout
    from tinytrain.plan.memory import activation_parts
    from tinytrain.plan.model_shape import shape_from_hf

    shape = shape_from_hf(LlamaConfig(**SHAPE), SHAPE["vocab_size"])
    # SDPA with the documents' mask (no fused kernel on a CPU): its masks grow as seq^2. What the
    # forward keeps, as the benchmark measures (the backward's peak on top is not read here). Ring's
    # count is the GPU's (a fused flex kernel, no masks): the CPU's SDPA over the block mask keeps
    # a boolean mask of seq / cp x seq per layer beside it.
    return activation_parts(shape=shape, layout=Layout.fp32, seq=seq, micro_batch=ROWS, tp=1, flash=False, cp=cp, ring=kind == "ring" and cp > 1).kept


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        cp, seq, repeats, out, kind = sys.argv[2:7]
        return worker(int(cp), int(seq), int(repeats), Path(out), kind)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", default="1024,2048,4096")
    parser.add_argument("--cp", default="1,2,4")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kind", choices=("ulysses", "ring"), default="ulysses")
    args = parser.parse_args()
    print(f"{args.kind}: model {SHAPE}, documents of {DOCUMENT} tokens, {ROWS} row, one torch thread per rank, {os.cpu_count()} cores")
    print(f"{'seq_len':>8} {'cp':>3} {'saved MB/rank':>14} {'x cp=1':>7} {'plan x cp=1':>12} {'step s':>8} {'s/token x cp=1':>15}")
    for seq in map(int, args.seq.split(",")):
        base = None
        for cp in map(int, args.cp.split(",")):
            r = run(cp, seq, args.repeats, args.kind)
            base = base or r
            print(f"{seq:>8} {cp:>3} {r['saved_bytes'] / 1e6:>14.1f} {r['saved_bytes'] / base['saved_bytes']:>7.3f} {planned(seq, cp, args.kind) / planned(seq, 1, args.kind):>12.3f} {r['seconds']:>8.3f} {r['seconds'] / base['seconds']:>15.3f}", flush=True)


if __name__ == "__main__":
    main()

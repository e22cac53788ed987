"""One decoder layer at long context on one GPU: what it keeps for backward against the plan's count,
its peak through backward, and its time, per attention kernel. Context parallelism needs several
GPUs; a layer's memory and time at 32k-128k tokens need one (issue 33's single-GPU check).

    python benchmarks/long_context_layer.py [--seqs 32768,65536,131072] [--kernels varlen,sdpa] [--json PATH]
    python benchmarks/long_context_layer.py --tiny [--json PATH]   # a CPU: a small layer at 0.5k-2k tokens

Llama-3-8B's layer (hidden 4096, 32 heads, 8 kv heads, intermediate 14336) with bf16 weights and
activations (DeepSpeed's layout, the long-context recipe's), one sequence (a long document), micro
batch 1. Per kernel and length: the bytes allocated after the forward over before it (what the layer
keeps; the plan counts plan/activations.py's 16-bit row x tokens), the peak of the layer checkpointed
in full through its recompute and backward (the plan counts RECOMPUTE_PEAK x the layer's
activations; on a CPU the allocator's count read after every operator), and the median time of
forward + backward (3 after a warm-up) with the
TFLOP/s of the layer's matmuls and causal attention (backward counted as twice the forward).
`varlen` is torch's varlen kernel as tinytrain registers it (model/varlen_attention.py), `sdpa`
transformers' SDPA path (the flash kernel, causal); on a CPU their pure-torch stand-ins and fp32-free
bf16 SDPA. --tiny proves the script: hidden 256, 0.5k-2k tokens, glibc's allocator count for `kept`.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import statistics
import time

import torch
from allocator_count import OperatorPeak
from allocator_count import allocated as host_allocated

LLAMA3_8B = dict(hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8)
TINY = dict(hidden_size=256, intermediate_size=704, num_attention_heads=8, num_key_value_heads=2)
GIB = 1024**3


def allocated(gpu: bool) -> int:
    return torch.cuda.memory_allocated() if gpu else host_allocated()


def implementation(kernel: str, gpu: bool) -> str:
    if kernel == "sdpa":
        return "sdpa"
    from packed_isolation import implementation as registered

    return registered("varlen", gpu)


def build_layer(shape: dict, kernel: str, gpu: bool, seq: int):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig(**shape, num_hidden_layers=1, vocab_size=128, max_position_embeddings=seq, rope_theta=500000.0)
    cfg._attn_implementation = implementation(kernel, gpu)
    device = "cuda" if gpu else "cpu"
    torch.manual_seed(0)
    return LlamaDecoderLayer(cfg, 0).to(device, torch.bfloat16), LlamaRotaryEmbedding(cfg).to(device), cfg


def planned_bytes(cfg, seq: int) -> tuple[float, float]:
    """(what the layer keeps, what its recompute holds at its peak in backward), as the plan counts them."""
    from tinytrain.plan.activations import RECOMPUTE_PEAK, Layout, layer_bytes
    from tinytrain.plan.model_shape import shape_from_hf

    kept = layer_bytes(shape_from_hf(cfg, cfg.vocab_size), Layout.sixteen_bit) * seq
    return kept, RECOMPUTE_PEAK * kept


def layer_flops(shape: dict, seq: int) -> float:
    """A forward's FLOPs: the projections and the MLP, and causal attention (half the square)."""
    h, i, heads, kv = shape["hidden_size"], shape["intermediate_size"], shape["num_attention_heads"], shape["num_key_value_heads"]
    head = h // heads
    matmuls = 2 * seq * (h * h + 2 * h * kv * head + h * h + 3 * h * i)
    attention = 2 * seq * seq * heads * head  # QK^T and PV, each 2 x seq^2 x width, halved by the mask
    return matmuls + attention


def recompute_peak(layer, forward, grad, gpu: bool) -> int:
    """The most allocated through the backward of the layer checkpointed in full (it keeps its
    input, recomputes its forward, then runs the backward), over before the forward, less the
    weights' gradients and the layer's output (in a model, the next layer's input)."""
    layer.zero_grad(set_to_none=True)
    gc.collect()
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    before = allocated(gpu)
    out = torch.utils.checkpoint.checkpoint(forward, use_reentrant=False)
    with contextlib.nullcontext() if gpu else OperatorPeak() as reading:  # CUDA keeps its own peak
        out.backward(grad)
    most = torch.cuda.max_memory_allocated() if gpu else reading.most
    return most - before - out.untyped_storage().nbytes() - sum(p.numel() * p.element_size() for p in layer.parameters())


def measure(shape: dict, kernel: str, seq: int, gpu: bool, repeats: int) -> dict:
    layer, rope, cfg = build_layer(shape, kernel, gpu, seq)
    device = "cuda" if gpu else "cpu"
    x = torch.randn(1, seq, shape["hidden_size"], device=device, dtype=torch.bfloat16, requires_grad=True)
    position_ids = torch.arange(seq, device=device)[None]
    with torch.no_grad():
        cos, sin = rope(x, position_ids)

    def forward():
        out = layer(x, position_embeddings=(cos, sin), position_ids=position_ids)
        return out[0] if isinstance(out, tuple) else out

    def sync():
        if gpu:
            torch.cuda.synchronize()

    # One step before the readings: a kernel's first call allocates what it keeps for later calls
    # (workspaces, thread buffers), which would read as kept by this layer.
    forward().backward(torch.ones((1, seq, shape["hidden_size"]), device=device, dtype=torch.bfloat16))
    x.grad = None
    layer.zero_grad(set_to_none=True)
    gc.collect()
    sync()
    before = allocated(gpu)
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    out = forward()
    sync()
    kept = allocated(gpu) - before - out.untyped_storage().nbytes()
    grad = torch.ones_like(out)
    out.backward(grad)
    del out
    peak = recompute_peak(layer, forward, grad, gpu)
    times = []
    for _ in range(repeats):
        x.grad = None
        layer.zero_grad(set_to_none=True)
        sync()
        start = time.perf_counter()
        forward().backward(torch.ones((1, seq, shape["hidden_size"]), device=device, dtype=torch.bfloat16))
        sync()
        times.append(time.perf_counter() - start)
    seconds = statistics.median(times)
    planned, planned_peak = planned_bytes(cfg, seq)
    return {
        "kernel": kernel,
        "attention": layer.self_attn.config._attn_implementation,
        "seq": seq,
        "kept_gib": kept / GIB,
        "plan_gib": planned / GIB,
        "kept_over_plan": kept / planned,
        "peak_gib": peak / GIB,
        "plan_peak_gib": planned_peak / GIB,
        "peak_over_plan": peak / planned_peak,
        "seconds": seconds,
        "tflops": 3 * layer_flops(shape, seq) / seconds / 1e12,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seqs", default="32768,65536,131072")
    parser.add_argument("--kernels", default="varlen,sdpa")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="a small layer at 0.5k-2k tokens, on a CPU")
    parser.add_argument("--json")
    args = parser.parse_args()
    gpu = torch.cuda.is_available() and not args.tiny
    shape, seqs = (TINY, [512, 1024, 2048]) if args.tiny else (LLAMA3_8B, [int(s) for s in args.seqs.split(",")])
    rows = []
    for seq in seqs:
        for kernel in args.kernels.split(","):
            try:
                row = measure(shape, kernel, seq, gpu, args.repeats)
            except torch.OutOfMemoryError as oom:
                row = {"kernel": kernel, "seq": seq, "error": f"out of memory: {str(oom).splitlines()[0]}"}
            rows.append(row)
            if "error" in row:
                print(f"{kernel:7s} {seq:>7d}  {row['error']}", flush=True)
            else:
                print(f"{kernel:7s} {seq:>7d}  kept {row['kept_gib']:.2f} GiB (plan {row['plan_gib']:.2f}, {row['kept_over_plan']:.2f}x)  peak {row['peak_gib']:.2f} GiB (plan {row['plan_peak_gib']:.2f}, {row['peak_over_plan']:.2f}x)  {row['seconds'] * 1e3:.0f} ms  {row['tflops']:.1f} TFLOP/s", flush=True)
            gc.collect()
            if gpu:
                torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(0) if gpu else "cpu", "shape": shape, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()

"""Tokens/s and MFU on one GPU: tinytrain vs a raw PyTorch loop, same model, batch and attention.

Default: the TinyLlama-1.1B architecture (vocab 32000, as with its Llama-2 tokenizer), seq 2048,
bf16 where the GPU has it, random tokens. tinytrain runs through build_module + build_trainer
(its fast paths: torch's varlen kernel or flash-attn 2 on a capable GPU, fused AdamW); the raw loop
uses the same HF model class and attention kernel with torch.autocast and fused AdamW. MFU = model FLOPs (tinytrain/plan/flops.py)
per second / the hardware table's dense peak.

    python benchmarks/mfu.py                      # on a GPU machine
    python benchmarks/mfu.py --tiny --steps 4     # CPU smoke check: tiny model, MFU omitted
    python benchmarks/mfu.py --compile --liger    # torch.compile (whole model) and liger-kernel on both sides
    python benchmarks/mfu.py --packed --checkpointing selective --compile blocks   # the levers, on packed documents
    python benchmarks/mfu.py --packed --fp8 --compile blocks   # float8 linears (torchao; compute capability >= 8.9)
    python benchmarks/mfu.py --packed --micro-batch 1 --accumulation 8   # the long-context shape: a step of 8 micro batches
`--packed`: rows packed from documents (position ids restart; the varlen kernel's boundaries), on
both sides; MFU then counts each document's own attention, as tinytrain's throughput callback does.
`--checkpointing` and `--compile` are the trainer's modes, applied to the raw model by the same
functions (model/activation_checkpointing.py, model/compile.py). The peak memory of each side is
measured apart and the tinytrain side's set against the plan's estimate.
`--json PATH` also writes the figures (benchmarks/gpu_check.py collects them); `--profile PATH`
profiles 3 more raw-loop steps (the same kernels) and writes torch's op table there.
Target on an H100: >= 55% MFU and ahead of the raw loop.
"""

from __future__ import annotations

import argparse
import gc
import json

import torch
from _common import REPO, median, packed_batches, raw_steps, setup, synthetic_batches, tinytrain_steps

# TinyLlama's own tokenizer (Llama-2's 32,000 pieces), where a copy is at hand: the loss then runs over
# the rows the plan counts. A GPU machine gets the checkout alone: carry benchmarks/.data.
LLAMA2_TOKENIZER = ("benchmarks/.data/llama2-tokenizer/tokenizer.model", "../shared/data/llama2-tokenizer/tokenizer.model")


def peak_gib(cuda: bool) -> float:
    """The peak CUDA memory allocated since the last call, in GiB; frees what the side before left."""
    if not cuda:
        return 0.0
    gc.collect()  # the trainer and its module hold each other: freed only by the collector
    peak = torch.cuda.max_memory_allocated() / 2**30
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return peak


def profile(model, optimizer, loader, true_vocab: int, grad_clip: float, dtype, path: str, steps: int = 3) -> list[dict]:
    """Three raw-loop steps under torch's profiler: the op table by self device time (CPU time on a
    CPU) written to `path`, and the top ops as [{op, ms_per_step, share}] of the profiled time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = torch.cuda.is_available()
    batches = [b for _, b in zip(range(steps), loader)]
    with torch_profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        raw_steps(model, optimizer, batches, true_vocab, grad_clip, 0, autocast_dtype=dtype)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = [e for e in prof.key_averages() if getattr(e, key) > 0]
    total = sum(getattr(e, key) for e in events) or 1.0
    with open(path, "w") as f:
        f.write(f"{steps} raw-loop steps, sorted by {key} (us); total {total / 1000:.1f} ms\n")
        f.write(prof.key_averages().table(sort_by=key, row_limit=40) + "\n")
    ranked = sorted(events, key=lambda e: getattr(e, key), reverse=True)[:8]
    top = [{"op": e.key, "ms_per_step": getattr(e, key) / 1000 / steps, "share": getattr(e, key) / total} for e in ranked]
    print("profile (raw loop, self time per step): " + "; ".join(f"{t['op']} {t['ms_per_step']:.1f} ms ({100 * t['share']:.0f}%)" for t in top[:5]))
    return top


def tinyllama_vocab() -> tuple[list[str], str]:
    """(overrides, what the loss runs over): the Llama-2 tokenizer where found; else TinyLlama's
    32,000-row head over the bundled tokenizer, whose loss covers its 4,096 rows alone."""
    for rel in LLAMA2_TOKENIZER:
        if (REPO / rel).exists():
            return ["tokenizer=llama2", f"tokenizer.path={(REPO / rel).resolve()}"], f"the Llama-2 tokenizer ({rel})"
    return ["model.vocab_size=32000"], ("the bundled tokenizer: the loss covers 4,096 of the head's 32,000 rows, the plan counts all "
                                         "(`mkdir -p benchmarks/.data && cp -r ../shared/data/llama2-tokenizer benchmarks/.data/`)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="tiny model, short sequences: proves the script on a CPU")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", nargs="?", const="model", default="none", choices=("none", "blocks", "model"), help="trainer.compile on the tinytrain side, the same compile on the raw side (alone: model)")
    parser.add_argument("--checkpointing", default="none", choices=("none", "full", "selective"), help="trainer.activation_checkpointing, the same on the raw side")
    parser.add_argument("--fp8", action="store_true", help="precision.fp8=true (torchao float8 linears, Hopper and newer) on the tinytrain side, the same conversion on the raw side")
    parser.add_argument("--packed", action="store_true", help="rows packed from documents of ~512 tokens (position ids restart per document)")
    parser.add_argument("--liger", action="store_true", help="trainer.liger=true on the tinytrain side and liger's kernels on the raw side (CUDA only)")
    parser.add_argument("--accumulation", type=int, default=1, help="micro batches per optimizer step on both sides (trainer.global_batch_size = micro x this); timed per step")
    parser.add_argument("--json", help="write the figures to this file")
    parser.add_argument("--profile", help="after the timed steps, profile 3 more steps of the raw loop (the same kernels: where the time goes) into this op table; the JSON gets the top costs")
    args = parser.parse_args()
    if args.accumulation < 1:
        parser.error(f"--accumulation {args.accumulation}: a step needs at least one micro batch (use --accumulation 1 for none)")
    if args.tiny:
        model, micro, seq, vocab_note = ["model=tiny"], 2, 128, "the bundled tokenizer"
    else:
        vocab, vocab_note = tinyllama_vocab()
        model, micro, seq = ["model=tinyllama_1b", *vocab], args.micro_batch, args.seq
    n = args.steps + args.warmup + 1
    overrides = [
        *model,
        f"trainer.micro_batch_size={micro}",
        f"trainer.global_batch_size={micro * args.accumulation}",
        f"data.seq_len={seq}",
        f"trainer.max_steps={n}",
        "trainer.warmup_steps=1",
        "trainer.progress_bar=false",
        "trainer.val_every_n_steps=100000",
        "trainer.checkpoint_every_n_steps=100000",
        f"trainer.compile={args.compile}",
        f"trainer.activation_checkpointing={args.checkpointing}",
        f"precision.fp8={str(args.fp8).lower()}",
        *(["precision.fp8_emulate=true"] if args.fp8 and args.tiny else []),  # the CPU proof: torchao's emulation
        f"trainer.liger={'true' if args.liger else 'false'}",
    ]
    cfg, tokenizer, plan, model_config = setup(overrides)
    attention = plan.attention

    from tinytrain.data.collate import COUNTS, collate_windows
    from tinytrain.model.activation_checkpointing import apply_checkpointing
    from tinytrain.model.compile import apply_compile
    from tinytrain.model.fp8 import apply_fp8
    from tinytrain.plan.flops import batch_flops
    from tinytrain.plan.precision import Dtype
    from tinytrain.train.callbacks.throughput import peak_tflops

    peak, note = peak_tflops(plan.hardware, plan.precision.dtype)
    acc = args.accumulation
    rows = (packed_batches if args.packed else synthetic_batches)(n * acc, plan.vocab.true, micro, seq)
    loader = torch.utils.data.DataLoader(rows, batch_size=micro, shuffle=False, collate_fn=collate_windows)
    tokens = micro * seq * acc  # per optimizer step
    # Each micro batch's attention spans as the collator counts them for the throughput monitor: whole
    # rows, or the packed documents (the mean over the batches).
    squares = [b[COUNTS][1] for b in loader]
    flops = batch_flops(plan.shape, tokens, acc * sum(squares) / len(squares))
    cuda = torch.cuda.is_available()
    print(f"{cfg.model.name}: batch {micro}x{seq}{f' x {plan.batch.accumulate_grad_batches} micro batches per step (plan)' if acc > 1 else ''}{' packed' if args.packed else ''}, precision {plan.precision.lightning}, attention {attention.implementation}, "
          f"checkpointing {args.checkpointing}, compile {args.compile}{', fp8' if plan.fp8.enabled else ''}, {note}; plan: {plan.memory.total_gib:.1f} GiB per GPU; vocab: {vocab_note}", flush=True)

    ours = median(tinytrain_steps(cfg, tokenizer, plan, loader, args.warmup))
    ours_peak = peak_gib(cuda)

    from transformers import AutoModelForCausalLM

    from tinytrain.model.build import register

    register(attention)  # the raw loop on the very kernel tinytrain's run used (torch varlen is tinytrain's own)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.seed)
    with device:  # initialised where it runs: a 1.1B model's random init on the CPU costs seconds of every lease's variant
        raw_model = AutoModelForCausalLM.from_config(model_config, attn_implementation=attention.implementation)
    if args.liger:
        from tinytrain.model.liger import apply_kernels

        apply_kernels(raw_model, cfg.model.arch)
    if plan.fp8.enabled:
        apply_fp8(raw_model, plan.fp8.emulate)
    apply_checkpointing(raw_model, args.checkpointing)
    apply_compile(raw_model, args.compile, "inductor")
    opt = torch.optim.AdamW(raw_model.parameters(), lr=cfg.trainer.lr, fused=device.type == "cuda")
    dtype = {Dtype.bf16: torch.bfloat16, Dtype.fp16: torch.float16}.get(plan.precision.dtype)
    raw = median(raw_steps(raw_model, opt, loader, plan.vocab.true, cfg.trainer.grad_clip, args.warmup, autocast_dtype=dtype, accumulation=acc))
    raw_peak = peak_gib(cuda)
    top = profile(raw_model, opt, loader, plan.vocab.true, cfg.trainer.grad_clip, dtype, args.profile) if args.profile else None

    def describe(seconds: float) -> str:
        mfu = f"MFU {100 * flops / seconds / (peak * 1e12):5.1f}%" if peak else "MFU omitted"
        return f"{tokens / seconds:10,.0f} tokens/s  {mfu}  ({seconds * 1000:.1f} ms/step)"

    print(f"tinytrain : {describe(ours)}")
    print(f"raw loop  : {describe(raw)}")
    print(f"ratio tinytrain / raw tokens/s = {raw / ours:.3f}")
    if cuda:
        print(f"peak memory: tinytrain {ours_peak:.1f} GiB (plan {plan.memory.total_gib:.1f} GiB), raw loop {raw_peak:.1f} GiB")
    if args.json:
        mfu = (lambda seconds: flops / seconds / (peak * 1e12)) if peak else (lambda seconds: None)
        figures = {"attention": attention.implementation, "vocab": vocab_note, "precision": plan.precision.lightning, "compile": args.compile, "liger": args.liger,
                   "checkpointing": args.checkpointing, "packed": args.packed, "fp8": plan.fp8.enabled, "batch": f"{micro}x{seq}" + (f" x {acc}" if acc > 1 else ""),
                   "tinytrain_tokens_per_s": tokens / ours, "raw_tokens_per_s": tokens / raw, "ratio": raw / ours,
                   "tinytrain_mfu": mfu(ours), "raw_mfu": mfu(raw), "peak_memory_gib": ours_peak if cuda else None,
                   "raw_peak_memory_gib": raw_peak if cuda else None, "plan_memory_gib": plan.memory.total_gib, "profile_top": top}
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()

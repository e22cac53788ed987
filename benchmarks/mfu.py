"""Tokens/s and MFU on one GPU: tinytrain vs a raw PyTorch loop, same model, batch and attention.

Default: the TinyLlama-1.1B architecture (vocab 32000, as with its Llama-2 tokenizer), seq 2048,
bf16 where the GPU has it, random tokens. tinytrain runs through build_module + build_trainer
(its fast paths: torch's varlen kernel or flash-attn 2 on a capable GPU, fused AdamW); the raw loop
uses the same HF model class and attention kernel with torch.autocast and fused AdamW. MFU = model FLOPs (tinytrain/plan/flops.py)
per second / the hardware table's dense peak.

    python benchmarks/mfu.py                      # on a GPU machine
    python benchmarks/mfu.py --tiny --steps 4     # CPU smoke check: tiny model, MFU omitted
    python benchmarks/mfu.py --compile --liger    # torch.compile and liger-kernel on both sides
`--json PATH` also writes the figures (benchmarks/gpu_check.py collects them).
Target on an H100: >= 55% MFU and ahead of the raw loop.
"""

from __future__ import annotations

import argparse
import json

import torch
from _common import median, raw_steps, setup, synthetic_batches, tinytrain_steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tiny", action="store_true", help="tiny model, short sequences: proves the script on a CPU")
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--compile", action="store_true", help="trainer.compile=true on the tinytrain side and torch.compile on the raw side")
    parser.add_argument("--liger", action="store_true", help="trainer.liger=true on the tinytrain side and liger's kernels on the raw side (CUDA only)")
    parser.add_argument("--json", help="write the figures to this file")
    args = parser.parse_args()
    if args.tiny:
        model, micro, seq = ["model=tiny"], 2, 128
    else:
        model, micro, seq = ["model=tinyllama_1b", "model.vocab_size=32000"], args.micro_batch, args.seq
    n = args.steps + args.warmup + 1
    overrides = [
        *model,
        f"trainer.micro_batch_size={micro}",
        f"data.seq_len={seq}",
        f"trainer.max_steps={n}",
        "trainer.warmup_steps=1",
        "trainer.progress_bar=false",
        "trainer.val_every_n_steps=100000",
        "trainer.checkpoint_every_n_steps=100000",
        f"trainer.compile={str(args.compile).lower()}",
        f"trainer.liger={'true' if args.liger else 'false'}",
    ]
    cfg, tokenizer, plan, model_config = setup(overrides)
    attention = plan.attention

    from tinytrain.plan.flops import batch_flops
    from tinytrain.plan.precision import Dtype
    from tinytrain.train.callbacks.throughput import peak_tflops

    peak, note = peak_tflops(plan.hardware, plan.precision.dtype)
    loader = torch.utils.data.DataLoader(synthetic_batches(n, plan.vocab.true, micro, seq), batch_size=micro, shuffle=False)
    tokens = micro * seq
    flops = batch_flops(plan.shape, tokens, micro * seq * seq)
    print(f"{cfg.model.name}: batch {micro}x{seq}, precision {plan.precision.lightning}, attention {attention.implementation}, {note}")

    ours = median(tinytrain_steps(cfg, tokenizer, plan, loader, args.warmup))

    from transformers import AutoModelForCausalLM

    from tinytrain.model.build import register

    register(attention)  # the raw loop on the very kernel tinytrain's run used (torch varlen is tinytrain's own)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(cfg.seed)
    raw_model = AutoModelForCausalLM.from_config(model_config, attn_implementation=attention.implementation).to(device)
    if args.liger:
        from tinytrain.model.liger import apply_kernels

        apply_kernels(raw_model, cfg.model.arch)
    if args.compile:
        raw_model.compile()
    opt = torch.optim.AdamW(raw_model.parameters(), lr=cfg.trainer.lr, fused=device.type == "cuda")
    dtype = {Dtype.bf16: torch.bfloat16, Dtype.fp16: torch.float16}.get(plan.precision.dtype)
    raw = median(raw_steps(raw_model, opt, loader, plan.vocab.true, cfg.trainer.grad_clip, args.warmup, autocast_dtype=dtype))

    def describe(seconds: float) -> str:
        mfu = f"MFU {100 * flops / seconds / (peak * 1e12):5.1f}%" if peak else "MFU omitted"
        return f"{tokens / seconds:10,.0f} tokens/s  {mfu}  ({seconds * 1000:.1f} ms/step)"

    print(f"tinytrain : {describe(ours)}")
    print(f"raw loop  : {describe(raw)}")
    print(f"ratio tinytrain / raw tokens/s = {raw / ours:.3f}")
    if args.json:
        mfu = (lambda seconds: flops / seconds / (peak * 1e12)) if peak else (lambda seconds: None)
        peak_gib = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        figures = {"attention": attention.implementation, "precision": plan.precision.lightning, "compile": args.compile, "liger": args.liger,
                   "tinytrain_tokens_per_s": tokens / ours, "raw_tokens_per_s": tokens / raw, "ratio": raw / ours,
                   "tinytrain_mfu": mfu(ours), "raw_mfu": mfu(raw), "peak_memory_gib": peak_gib}
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)


if __name__ == "__main__":
    main()

"""tinytrain's training step vs a raw PyTorch loop: same tiny Llama, batch, AdamW, clipping, CPU.

The tinytrain side is the real thing: the LightningModule and the Trainer that `fit` builds
(tinytrain.train.build_module / build_trainer, with its callbacks and CSV logging). The raw side
is forward, loss, backward, clip_grad_norm_, AdamW step, scheduler step, zero_grad. Both iterate
an identical DataLoader; a step is timed from one batch to the next. Blocks alternate
raw, tinytrain, raw, tinytrain, ..., raw (--rounds tinytrain blocks), and each side's median is
taken over all its blocks (this machine is noisy).

    python benchmarks/step_overhead.py [--steps 40] [--warmup 5] [--rounds 2] [--micro-batch 8] [--seq-len 256]
Target: ratio <= 1.05; <= 1.02 at small steps, where a fixed per-step cost shows (issue 34:
--micro-batch 8 --seq-len 32, ~70 ms on a 2-core CPU).
"""

from __future__ import annotations

import argparse

import torch
from _common import median, raw_steps, setup, synthetic_batches, tinytrain_steps

OVERRIDES = ["trainer.progress_bar=false", "trainer.val_every_n_steps=100000", "trainer.checkpoint_every_n_steps=100000"]


def raw_block(model_config, cfg, true_vocab, loader, warmup: int) -> list[float]:
    from transformers import AutoModelForCausalLM

    from tinytrain.model.module import param_groups
    from tinytrain.plan.schedule import warmup_cosine

    t = cfg.trainer
    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(model_config, attn_implementation="sdpa")
    opt = torch.optim.AdamW(param_groups(model, t.weight_decay), lr=t.lr, betas=tuple(t.betas), eps=t.eps)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: warmup_cosine(s, t.warmup_steps, t.max_steps, t.min_lr_ratio))
    return raw_steps(model, opt, loader, true_vocab, t.grad_clip, warmup, scheduler=sched)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=256, help="smaller steps show a fixed per-step cost more")
    args = parser.parse_args()
    n = args.steps + args.warmup + 1
    shape = [f"trainer.micro_batch_size={args.micro_batch}", f"data.seq_len={args.seq_len}"]
    cfg, tokenizer, plan, model_config = setup([*OVERRIDES, *shape, f"trainer.max_steps={n}", "trainer.warmup_steps=2"])
    micro, seq = plan.batch.micro_batch_size, plan.batch.seq_len
    loader = torch.utils.data.DataLoader(synthetic_batches(n, plan.vocab.true, micro, seq), batch_size=micro, shuffle=False)
    print(f"model {cfg.model.name} ({plan.shape.hidden}x{plan.shape.layers}), batch {micro}x{seq}, {args.steps} timed steps after {args.warmup} warm-up, {torch.get_num_threads()} threads")
    raw_blocks = [raw_block(model_config, cfg, plan.vocab.true, loader, args.warmup)]
    ours_blocks = []
    for _ in range(args.rounds):
        ours_blocks.append(tinytrain_steps(cfg, tokenizer, plan, loader, args.warmup))
        raw_blocks.append(raw_block(model_config, cfg, plan.vocab.true, loader, args.warmup))
    raw, tt = median(sum(raw_blocks, [])), median(sum(ours_blocks, []))

    def blocks(bs):
        return " / ".join(f"{median(b) * 1000:.1f}" for b in bs)

    print(f"raw PyTorch loop    median step {raw * 1000:8.1f} ms  (blocks: {blocks(raw_blocks)} ms)")
    print(f"tinytrain (Trainer) median step {tt * 1000:8.1f} ms  (blocks: {blocks(ours_blocks)} ms)")
    print(f"ratio tinytrain / raw = {tt / raw:.3f}  (target <= 1.05)")


if __name__ == "__main__":
    main()

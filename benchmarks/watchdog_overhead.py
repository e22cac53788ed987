"""The step-time cost of the hang watchdog and the straggler checks: tinytrain's Trainer with them
(the rank's heartbeat callback writing a file per step, the watchdog process polling beside it,
faulthandler registered, the straggler callback timing every micro batch) vs the same Trainer
without (cluster.watchdog=false, no straggler callback). One process, CPU, a small Llama whose
step is short (~tens of ms), so a per-step cost shows. Blocks alternate off, on, off, on, ..., off
and each side's median is over all its blocks (this machine is noisy).

Not in it: the straggler exchange itself, one all_gather of one number every
cluster.straggler_every_n_steps (50) steps on runs of 2+ ranks; and the flight recorder, which
records only collectives.

    python benchmarks/watchdog_overhead.py [--steps 150] [--warmup 10] [--rounds 2]
Target: ratio <= 1.01.
"""

from __future__ import annotations

import argparse

import torch
from _common import median, setup, synthetic_batches, tinytrain_steps

OVERRIDES = [
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.num_heads=4",
    "model.num_kv_heads=2",
    "model.intermediate_size=128",
    "trainer.micro_batch_size=4",
    "data.seq_len=64",
    "trainer.progress_bar=false",
    "trainer.val_every_n_steps=100000",
    "trainer.checkpoint_every_n_steps=100000",
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    n = args.steps + args.warmup + 1
    cfg, tokenizer, plan, _ = setup([*OVERRIDES, f"trainer.max_steps={n}", "trainer.warmup_steps=2"])
    micro, seq = plan.batch.micro_batch_size, plan.batch.seq_len
    loader = torch.utils.data.DataLoader(synthetic_batches(n, plan.vocab.true, micro, seq), batch_size=micro, shuffle=False)
    print(f"model {plan.shape.hidden}x{plan.shape.layers}, batch {micro}x{seq}, {args.steps} timed steps after {args.warmup} warm-up, {torch.get_num_threads()} threads")

    def off():
        return tinytrain_steps(cfg, tokenizer, plan, loader, args.warmup)

    def on():
        from tinytrain.train.callbacks.stragglers import Stragglers

        return tinytrain_steps(cfg, tokenizer, plan, loader, args.warmup, extra_callbacks=[Stragglers(cfg.cluster.straggler_every_n_steps, cfg.cluster.straggler_threshold)], watched=True)

    off_blocks, on_blocks = [off()], []
    for _ in range(args.rounds):
        on_blocks.append(on())
        off_blocks.append(off())
    base, watched = median(sum(off_blocks, [])), median(sum(on_blocks, []))

    def blocks(bs):
        return " / ".join(f"{median(b) * 1000:.2f}" for b in bs)

    print(f"without watchdog, stragglers  median step {base * 1000:7.2f} ms  (blocks: {blocks(off_blocks)} ms)")
    print(f"with watchdog + stragglers    median step {watched * 1000:7.2f} ms  (blocks: {blocks(on_blocks)} ms)")
    print(f"ratio with / without = {watched / base:.3f}  (target <= 1.01)")


if __name__ == "__main__":
    main()

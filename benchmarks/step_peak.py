"""A whole training step's peak memory on this CPU: tinytrain's step against the same step with
Lightning's own gradient zeroing (inside the next step's closure, after its forward) and a raw loop
(forward, loss, backward, clip, AdamW, zero_grad), side by side in one process, at three model sizes
and two micro batches; beside them the plan's count of what a step adds to its weights and optimizer
state (its total less them: plan/step_peak.py) and the count before it (activations + gradients).

The reading is glibc's allocator count after every operator of the step (benchmarks/allocator_count.py:
a CPU tensor is one malloc, nothing is cached), less what the step starts with apart from gradients
(the weights and AdamW's moments): what the step adds to its model states at its peak.

    python benchmarks/step_peak.py [--sizes 5M,40M,150M] [--micro 1,8] [--seq 256] [--steps 3]
"""

from __future__ import annotations

import argparse
import gc
import types

import lightning.pytorch as pl
import torch
from _common import raw_steps, setup, synthetic_batches, tinytrain_steps
from allocator_count import OperatorPeak, allocated, has_mallinfo2, step_peak_callback

# hidden, layers, heads, intermediate (benchmarks/host_memory.py's sizes), the bundled 4096-token tokenizer
SIZES = {"5M": (256, 4, 4, 704), "40M": (640, 8, 10, 1728), "150M": (1024, 12, 16, 2816)}
MIB = 2**20


class LightningOrder(pl.Callback):
    """The LightningModule's own optimizer_step on tinytrain's module: the gradients wait for the
    next step's closure, after its forward (the order before tinytrain freed them with the step)."""

    def setup(self, trainer, pl_module, stage):
        pl_module.optimizer_step = types.MethodType(pl.LightningModule.optimizer_step, pl_module)


def raw_peaks(cfg, plan, model_config, loader) -> list[int]:
    from transformers import AutoModelForCausalLM

    torch.manual_seed(cfg.seed)
    model = AutoModelForCausalLM.from_config(model_config, attn_implementation=plan.attention.implementation)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.trainer.lr)
    peaks = []
    for batch in loader:
        gc.collect()
        start = allocated()
        with OperatorPeak() as reading:
            raw_steps(model, optimizer, [batch], plan.vocab.true, cfg.trainer.grad_clip, 0, autocast_dtype=torch.bfloat16)
        peaks.append(reading.most - start)
    return peaks


def measure(size: str, micro: int, seq: int, steps: int) -> dict:
    hidden, layers, heads, intermediate = SIZES[size]
    overrides = [f"model.hidden_size={hidden}", f"model.num_layers={layers}", f"model.num_heads={heads}", f"model.num_kv_heads={heads}", f"model.intermediate_size={intermediate}",
                 "precision=bf16", f"trainer.micro_batch_size={micro}", f"data.seq_len={seq}", f"trainer.max_steps={steps}", "trainer.warmup_steps=1",
                 "trainer.progress_bar=false", "trainer.val_every_n_steps=100000", "trainer.checkpoint_every_n_steps=100000"]
    cfg, tokenizer, plan, model_config = setup(overrides)
    from tinytrain.data.collate import collate_windows

    loader = torch.utils.data.DataLoader(synthetic_batches(steps, plan.vocab.true, micro, seq), batch_size=micro, collate_fn=collate_windows)
    m = plan.memory
    row = {"size": size, "micro": micro, "plan_mib": (m.total_gib - m.params_gib - m.optimizer_gib - m.reference_gib) * 1024, "sum_mib": (m.activations_gib + m.grads_gib) * 1024}
    for name, lightning_order in (("tinytrain", False), ("lightning_order", True)):
        reading = step_peak_callback()
        tinytrain_steps(cfg, tokenizer, plan, loader, 0, extra_callbacks=[reading, *([LightningOrder()] if lightning_order else [])])
        row[name] = max(reading.peaks[1:]) / MIB  # after the first step, which builds AdamW's state
    row["raw"] = max(raw_peaks(cfg, plan, model_config, loader)[1:]) / MIB
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="5M,40M,150M")
    parser.add_argument("--micro", default="1,8")
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    if not has_mallinfo2():
        raise SystemExit("step_peak.py reads glibc's mallinfo2 (glibc 2.33 and newer)")
    from tinytrain.train.trainer import quiet_lightning

    quiet_lightning()
    print("| size | micro batch | tinytrain MiB | Lightning's order MiB | raw loop MiB | tinytrain / Lightning's order | tinytrain / plan | tinytrain / activations + gradients |")
    print("|---|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        for micro in (int(m) for m in args.micro.split(",")):
            r = measure(size, micro, args.seq, args.steps)
            print(f"| {size} | {micro} x {args.seq} | {r['tinytrain']:.1f} | {r['lightning_order']:.1f} | {r['raw']:.1f} | {r['tinytrain'] / r['lightning_order']:.3f} | {r['tinytrain'] / r['plan_mib']:.3f} | {r['tinytrain'] / r['sum_mib']:.3f} |", flush=True)


if __name__ == "__main__":
    main()

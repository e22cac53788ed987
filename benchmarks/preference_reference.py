"""DPO step cost by where the reference comes from, side by side in one process: a frozen copy
scored online each step (finetune=full) vs log-probs precomputed once and carried in the batch
(finetune.precompute_reference=true), with an SFT step on the same rows as the baseline.

Each side runs tinytrain's CausalLMModule on the same model and batch (forward, loss, backward,
Adam step), interleaved in rounds so load on a shared machine hits all alike; the median per
side and the ratios are printed. The one-off cost of precompute is one reference forward per pair.

    python benchmarks/preference_reference.py [--hidden 256 --layers 4 --pairs 8 --seq 128 --rounds 5]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from types import SimpleNamespace

import torch


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--pairs", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=3, help="steps per side per round")
    args = ap.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    from tinytrain.model.module import CausalLMModule
    from tinytrain.model.module_spec import ModuleSpec
    from tinytrain.model.preference_loss import PreferenceObjective
    from tinytrain.model.reference import FrozenReference

    vocab = 4096
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=args.hidden, num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64, num_key_value_heads=max(1, args.hidden // 128), intermediate_size=args.hidden * 4, attn_implementation="sdpa")
    torch.manual_seed(0)
    base = LlamaForCausalLM(cfg)
    rows = 2 * args.pairs
    ids = torch.randint(0, vocab, (rows, args.seq))
    labels = ids.roll(-1, 1)
    labels[:, : args.seq // 2] = -100  # the prompt half is masked
    labels[:, -1] = -100
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}

    t = SimpleNamespace(lr=1e-4, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.0)
    dpo = PreferenceObjective("dpo", 0.1)
    sides = {
        "sft (baseline)": (CausalLMModule(copy.deepcopy(base), ModuleSpec(vocab)), batch),
        "dpo, online frozen copy": (CausalLMModule(copy.deepcopy(base), ModuleSpec(vocab, objective=dpo), FrozenReference(copy.deepcopy(base))), batch),
    }
    module = sides["dpo, online frozen copy"][0]
    precomputed = {**batch, "ref_logps": module.reference_logps(batch)}
    sides["dpo, precomputed reference"] = (CausalLMModule(copy.deepcopy(base), ModuleSpec(vocab, objective=dpo)), precomputed)
    optimizers = {name: torch.optim.AdamW(m.parameters(), lr=t.lr) for name, (m, _) in sides.items()}

    def step(name: str) -> None:
        m, b = sides[name]
        loss = m.batch_loss(b) if m.objective is None else m.preference_step(b)[0]
        loss.backward()
        optimizers[name].step()
        optimizers[name].zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {name: [] for name in sides}
    for name in sides:
        step(name)  # warm-up
    for _ in range(args.rounds):
        for name in sides:
            start = time.perf_counter()
            for _ in range(args.steps):
                step(name)
            times[name].append((time.perf_counter() - start) / args.steps)
    median = {name: statistics.median(v) for name, v in times.items()}
    print(f"{rows} rows ({args.pairs} pairs) x {args.seq} tokens, Llama hidden {args.hidden} x {args.layers} layers, {torch.get_num_threads()} thread(s); median of {args.rounds} rounds")
    base_s = median["sft (baseline)"]
    for name, s in median.items():
        print(f"  {name:28s} {1000 * s:8.1f} ms per step   {s / base_s:.2f}x the SFT step")
    print(f"online / precomputed: {median['dpo, online frozen copy'] / median['dpo, precomputed reference']:.2f}")


if __name__ == "__main__":
    main()

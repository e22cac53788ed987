"""trainer.optimizer=muon against AdamW: one optimizer step's time and the optimizer state's memory,
as ratios to AdamW's measured in the same run, at three model sizes.

The optimizers are the ones a run builds (tinytrain.model.optimizers: torch.optim.Muon for the
hidden matrices + AdamW for the rest, vs AdamW for all), on a Llama of each size with random
gradients; a step is timed alone (no forward or backward), the two alternating, median of
--steps after --warmup. Memory: bytes of optimizer state (the tensors in optimizer.state), and on
a GPU the peak allocated during a step beyond the weights, gradients and state.

    python benchmarks/optimizer_step.py [--steps 3] [--warmup 2] [--device cpu|cuda]
Expected: state ratio ~0.5-0.8 (Muon keeps one buffer per hidden matrix, AdamW two; the embedding
and head, on AdamW, dominate small models); the step costs Newton-Schulz (5 iterations of matmuls per
matrix, in bf16 as torch's Muon runs it on a GPU; in fp32 on CPU, as a 32-true run's plan picks it):
the GPU sizes are the ones to read for a real run.
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch
from _common import _sync, median

# (hidden, layers, intermediate); on CPU smaller ones.
SIZES = {"cuda": {"h1024 x 8": (1024, 8, 2752), "h2048 x 8": (2048, 8, 5504), "h4096 x 4": (4096, 4, 11008)}, "cpu": {"h64 x 4": (64, 4, 176), "h128 x 4": (128, 4, 352), "h256 x 4": (256, 4, 704)}}


def model_of(hidden: int, layers: int, intermediate: int, device):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=4096, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=max(1, hidden // 64), num_key_value_heads=max(1, hidden // 128))
    return LlamaForCausalLM(config).to(device)


def optimizer_for(model, name: str, device):
    from tinytrain.config.schema import OptimizerName
    from tinytrain.model import optimizers

    # Newton-Schulz's dtype as a run's plan picks it: fp32 under 32-true (CPU), bf16 under bf16-mixed.
    ns_dtype = "float32" if device.type == "cpu" else "bfloat16"
    t = SimpleNamespace(optimizer=OptimizerName(name), lr=3e-3, betas=[0.9, 0.95], eps=1e-8, weight_decay=0.1, muon_momentum=0.95, muon_ns_dtype=ns_dtype)
    return optimizers.build(optimizers.optimizer_groups(model, t), t, cpu_adam=False, fused_adamw=False, deepspeed=False)


def state_bytes(opt) -> int:
    return sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0)


def timed_steps(model, opt, n: int, device) -> list[float]:
    times = []
    for _ in range(n):
        _sync(device)
        t0 = time.perf_counter()
        opt.step()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"device {device}, {torch.get_num_threads()} threads, median of {args.steps} steps after {args.warmup}")
    print(f"{'model':<20} {'params':>9} {'adamw ms':>9} {'muon ms':>9} {'time x':>7} {'adamw MB':>9} {'muon MB':>8} {'state x':>8}" + (f" {'peak x':>7}" if device.type == "cuda" else ""))
    for label, (hidden, layers, intermediate) in SIZES[device.type].items():
        runs = {}
        for name in ("adamw", "muon"):
            model = model_of(hidden, layers, intermediate, device)
            for p in model.parameters():
                p.grad = torch.randn_like(p)
            opt = optimizer_for(model, name, device)
            timed_steps(model, opt, args.warmup, device)
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            times = timed_steps(model, opt, args.steps, device)
            peak = torch.cuda.max_memory_allocated() - base if device.type == "cuda" else 0
            runs[name] = (median(times) * 1e3, state_bytes(opt), peak, sum(p.numel() for p in model.parameters()))
            del model, opt
        (a_ms, a_state, a_peak, params), (m_ms, m_state, m_peak, _) = runs["adamw"], runs["muon"]
        line = f"{label:<20} {params / 1e6:>8.1f}M {a_ms:>9.2f} {m_ms:>9.2f} {m_ms / a_ms:>7.2f} {a_state / 1e6:>9.1f} {m_state / 1e6:>8.1f} {m_state / a_state:>8.2f}"
        if device.type == "cuda":
            line += f" {(m_peak + m_state) / max(1, a_peak + a_state):>7.2f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()

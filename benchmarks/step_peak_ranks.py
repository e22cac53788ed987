"""A whole fsdp_tp step's peak memory per rank on this CPU at 2 and 4 processes (gloo), three model
sizes, against the plan's count: how the count's fit grows with the world where only 2 processes
were read before (tests/integration/test_step_memory.py). Every rank trains three steps through
tinytrain's own module and Trainer with benchmarks/allocator_count.py's step-peak callback (glibc's
count after every operator, less the weights and AdamW's state); rank 0's peak after the first step
is divided by the plan's total less its weights and optimizer state (plan/step_peak.py), and by the
count before it (activations + gradients). One malloc arena, as gloo's threads allocate some of what
a step keeps.

    python benchmarks/step_peak_ranks.py [--sizes 5M,40M,150M] [--layouts 2x1,2x2,4x1,4x2] [--micro 1] [--seq 256]

A layout `WxT` is W processes at tp T (dp = W / T). Each run's ranks are this script again with
`--rank OUT_DIR` and their overrides.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from step_peak import SIZES

MIB = 2**20
HERE = Path(__file__).resolve().parent


def overrides_for(size: str, strategy: str, world: int, tp: int, micro: int, seq: int, checkpointing: str) -> list[str]:
    hidden, layers, heads, intermediate = SIZES[size]
    layout = [f"parallel={strategy}", f"parallel.tp={tp}"] if strategy == "fsdp_tp" else [f"parallel={strategy}", "parallel.deepspeed_on_cpu=true"]
    return [*layout, f"model.hidden_size={hidden}", f"model.num_layers={layers}", f"model.num_heads={heads}", f"model.num_kv_heads={heads}", f"model.intermediate_size={intermediate}",
            "precision=bf16", f"cluster.devices={world}", f"trainer.activation_checkpointing={checkpointing}",
            f"trainer.micro_batch_size={micro}", f"data.seq_len={seq}", "trainer.max_steps=3", "trainer.warmup_steps=1",
            "trainer.progress_bar=false", "trainer.val_every_n_steps=100000", "trainer.checkpoint_every_n_steps=100000"]


def rank(out_dir: Path, overrides: list[str]) -> None:
    """One rank: three steps, rank 0 writes its peaks and the plan's counts."""
    import torch
    import torch.distributed as dist
    from _common import setup, synthetic_batches, tinytrain_steps
    from allocator_count import step_peak_callback
    from rank_exit import end_rank

    from tinytrain.data.collate import collate_windows
    from tinytrain.train.trainer import quiet_lightning

    quiet_lightning()
    cfg, tokenizer, plan, _ = setup(overrides)
    micro, seq = cfg.trainer.micro_batch_size, cfg.data.seq_len
    loader = torch.utils.data.DataLoader(synthetic_batches(3, plan.vocab.true, micro, seq), batch_size=micro, collate_fn=collate_windows)
    reading = step_peak_callback()
    tinytrain_steps(cfg, tokenizer, plan, loader, 0, extra_callbacks=[reading])
    if dist.get_rank() == 0:
        m = plan.memory
        counted = (m.total_gib - m.params_gib - m.optimizer_gib - m.reference_gib) * 2**30
        (out_dir / "reading.json").write_text(json.dumps({"peaks": reading.peaks, "counted": counted, "sum": (m.activations_gib + m.grads_gib) * 2**30, "peak_at": m.step["peak_at"]}))
    end_rank()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(overrides: list[str], world: int) -> dict:
    with tempfile.TemporaryDirectory() as out:
        env = {**os.environ, "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "MALLOC_ARENA_MAX": "1", "OMP_NUM_THREADS": "1"}
        procs = [subprocess.Popen([sys.executable, __file__, "--rank", out, *overrides], cwd=HERE.parent, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for r in range(world)]
        logs = [p.communicate(timeout=1200)[0] for p in procs]
        if any(p.returncode for p in procs):
            raise SystemExit("a rank failed:\n" + "\n".join(log[-3000:] for log in logs))
        reading = json.loads((Path(out) / "reading.json").read_text())
    reading["measured"] = max(reading["peaks"][1:])  # after the first step, which builds AdamW's state
    return reading


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="5M,40M,150M")
    parser.add_argument("--strategies", default="fsdp_tp", help="fsdp_tp, zero1, zero2, zero3 (DeepSpeed at tp 1)")
    parser.add_argument("--layouts", default="2x1,2x2,4x1,4x2")
    parser.add_argument("--checkpointing", default="none,full")
    parser.add_argument("--micro", type=int, default=1)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--rank", help=argparse.SUPPRESS)
    args, overrides = parser.parse_known_args()
    if args.rank:
        return rank(Path(args.rank), overrides)
    from allocator_count import has_mallinfo2

    if not has_mallinfo2():
        raise SystemExit("step_peak_ranks.py reads glibc's mallinfo2 (glibc 2.33 and newer)")
    print("| strategy | size | processes x tp | checkpointing | rank 0 MiB | plan MiB | read / plan | read / (activations + gradients) | plan peaks in |")
    print("|---|---|---|---|---|---|---|---|---|")
    for strategy in args.strategies.split(","):
        for size in args.sizes.split(","):
            for layout in args.layouts.split(","):
                world, tp = (int(x) for x in layout.split("x"))
                if tp > 1 and strategy != "fsdp_tp":
                    continue
                for checkpointing in args.checkpointing.split(","):
                    r = measure(overrides_for(size, strategy, world, tp, args.micro, args.seq, checkpointing), world)
                    print(f"| {strategy} | {size} | {world} x tp {tp} | {checkpointing} | {r['measured'] / MIB:.1f} | {r['counted'] / MIB:.1f} | {r['measured'] / r['counted']:.3f} | {r['measured'] / r['sum']:.3f} | {r['peak_at']} |", flush=True)


if __name__ == "__main__":
    main()

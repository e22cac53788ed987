"""Checkpoint saves at three model sizes on gloo processes (CPU): gathered vs sharded vs async.

What fsdp_tp's saves do, with the same primitives (train/sharded_checkpoints.py): a Llama sharded
with FSDP2 over `--world` ranks, AdamW stepped once (so the moments exist), then each way of saving
the weights + optimizer state, in one process group, side by side:

  gathered  the full state dict (full_state_dict=True, cpu_offload) on rank 0, one torch.save there
            (what fsdp_tp did before sharded saves)
  sharded   torch.distributed.checkpoint.save: every rank writes its own shard file
  async     torch.distributed.checkpoint.async_save on a process group of its own: training is
            stalled only until the shards are staged in host memory; the write goes on behind it

Per rank: peak extra RSS during the save over the RSS before it (psutil, sampled every 2 ms), the
wall time the training thread is stalled, and the bytes on disk (each rank's own shard file).
Targets (issue 22): sharded rank-0 peak extra <= 1.3x its own shard (gathered grows with the whole
model); async stall <= 20% of the synchronous sharded save's.

    python benchmarks/checkpoint_scaling.py [--world 2] [--sizes 10M,50M,200M] [--dir /tmp/x]
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

# hidden, layers, intermediate, vocab: ~10M, ~50M, ~200M parameters (untied embeddings)
SIZES = {"10M": (256, 4, 1024, 8192), "50M": (512, 8, 2048, 16384), "200M": (1024, 8, 4096, 32000)}
MODES = ("sharded", "async", "gathered")  # gathered last: it leaves the most memory behind


class PeakRSS:
    """Highest resident set size of this process while the block runs, sampled in a thread."""

    def __init__(self, interval: float = 0.002):
        import psutil

        self.process, self.interval = psutil.Process(), interval
        self.peak = 0
        self._stop = threading.Event()

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, self.process.memory_info().rss)
            time.sleep(self.interval)

    def __enter__(self):
        self.before = self.process.memory_info().rss
        self.peak = self.before
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def sample_until(self, done):
        """Keep sampling after the block (an async write) until `done()`."""
        while not done():
            time.sleep(self.interval)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)

    @property
    def extra(self) -> int:
        return self.peak - self.before


def release_memory() -> None:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # hand freed heap back, so the next RSS baseline is honest
    except OSError:
        pass


def worker(rank: int, world: int, size: str, out_dir: str, port: int, results) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    hidden, layers, inter, vocab = SIZES[size]
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, intermediate_size=inter, vocab_size=vocab, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64, tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(0, vocab, (1, 32))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
    background = dist.new_group(backend="gloo")
    row = {"rank": rank, "params": params}
    for mode in MODES:
        folder = Path(out_dir) / f"{size}-{mode}"
        release_memory()
        dist.barrier()
        with PeakRSS() as rss:
            start = time.perf_counter()
            if mode == "gathered":
                weights, optim = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
                if rank == 0:
                    folder.mkdir(parents=True, exist_ok=True)
                    torch.save({"state_dict": weights, "optimizer": optim}, folder / "full.ckpt")
                del weights, optim
                stall = time.perf_counter() - start
            else:
                weights, optim = get_state_dict(model, opt)
                state = {"state_dict": weights, "optimizer_0": optim}
                if mode == "sharded":
                    dcp.save(state, checkpoint_id=str(folder))
                    stall = time.perf_counter() - start
                else:
                    future = dcp.async_save(state, checkpoint_id=str(folder), process_group=background)
                    stall = time.perf_counter() - start
                    rss.sample_until(future.done)
                    future.result()
                del state, weights, optim
            total = time.perf_counter() - start
        dist.barrier()
        own = folder / ("full.ckpt" if mode == "gathered" else f"__{rank}_0.distcp")
        row[mode] = {"extra": rss.extra, "stall": stall, "total": total, "own_bytes": own.stat().st_size if own.exists() else 0}
    results.put(row)
    dist.barrier()
    dist.destroy_process_group()


def run_size(size: str, world: int, out_dir: Path) -> list[dict]:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=worker, args=(r, world, size, str(out_dir), port, results)) for r in range(world)]
    for p in procs:
        p.start()
    rows = [results.get(timeout=1800) for _ in procs]
    for p in procs:
        p.join()
    disk = {mode: sum(f.stat().st_size for f in (out_dir / f"{size}-{mode}").rglob("*") if f.is_file()) for mode in MODES}
    for mode in MODES:
        shutil.rmtree(out_dir / f"{size}-{mode}", ignore_errors=True)
    return sorted(rows, key=lambda r: r["rank"]), disk


def mb(n: float) -> str:
    return f"{n / 1e6:,.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--sizes", default="10M,50M,200M")
    parser.add_argument("--dir", default=None, help="where the checkpoints are written (default: a temp folder)")
    args = parser.parse_args()
    out_dir = Path(args.dir or tempfile.mkdtemp(prefix="checkpoint-scaling-"))
    print(f"{args.world} gloo processes, FSDP2, fp32 weights + AdamW moments; MB = 1e6 bytes; extra = peak RSS during the save - RSS before it")
    print(f"{'model':>6} {'params':>8} {'mode':>9} {'disk MB':>8} {'r0 shard MB':>11} {'r0 extra MB':>11} {'r1 extra MB':>11} {'r0 extra/shard':>14} {'stall s':>8} {'stall/sync':>10} {'write s':>8}")
    for size in args.sizes.split(","):
        rows, disk = run_size(size, args.world, out_dir)
        r0, r1 = rows[0], rows[1]
        shard = r0["sharded"]["own_bytes"]
        sync = r0["sharded"]["stall"]
        for mode in MODES:
            a, b = r0[mode], r1[mode]
            print(
                f"{size:>6} {r0['params'] / 1e6:>7.1f}M {mode:>9} {mb(disk[mode]):>8} {mb(shard):>11} {mb(a['extra']):>11} {mb(b['extra']):>11} "
                f"{a['extra'] / shard:>14.2f} {a['stall']:>8.2f} {a['stall'] / sync:>10.2f} {a['total']:>8.2f}",
                flush=True,
            )
    shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()

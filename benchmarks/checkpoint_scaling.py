"""Checkpoint saves at three model sizes on gloo processes (CPU): gathered vs sharded vs async.

What fsdp_tp's saves do, with the same primitives (train/sharded_checkpoints.py): a Llama sharded
with FSDP2 over `--world` ranks, AdamW stepped once (so the moments exist), then each way of saving
the weights + optimizer state, in one process group, side by side:

  gathered  the full state dict (full_state_dict=True, cpu_offload) on rank 0, one torch.save there
            (what fsdp_tp did before sharded saves)
  sharded   torch.distributed.checkpoint.save: every rank writes its own shard file
  async     torch.distributed.checkpoint.async_save on a process group of its own, staging (the
            copy into host memory) on the training thread: training is stalled until the shards
            are copied; the write goes on behind it (checkpoint.async_save before background staging)
  async_bg  the same with the copy made by a background thread too (DCP's DefaultStager with
            use_async_staging, kept for the run so its buffers are reused): the next step's forward
            and backward run while it copies, its optimizer step waits for the copy (what
            checkpoint.async_save does, train/sharded_checkpoints.py)

Each mode saves twice. The first save alone, to the end of its write: per rank the peak extra RSS
over the RSS before it (psutil, sampled every 2 ms), the write's wall time and the bytes on disk
(each rank's own shard file). The second at a step boundary with the training step after it: the
wall time the training thread is stalled (blocked in the save's call, and for async_bg also waiting
for the copy before that step's optimizer update), the time of that step (forward, backward, AdamW;
the wait for the copy left out) and of a step without a save (the mean of two just before): on a CPU
the background copy and write compete with the step for the cores (on a GPU the copy is a
device-to-host transfer). async_bg's second save copies into the first's buffers, as every save of a
run after its first does.
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
MODES = ("sharded", "async", "async_bg", "gathered")  # gathered last: it leaves the most memory behind


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

    def forward_backward():
        model(input_ids=ids, labels=ids).loss.backward()

    def update():
        opt.step()
        opt.zero_grad()

    forward_backward()
    update()
    background = dist.new_group(backend="gloo")
    from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

    stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=False))
    row = {"rank": rank, "params": params}

    def save(mode: str, folder: Path):
        """Starts the save; returns (the write's future, the copy's future), None where done."""
        if mode == "gathered":
            weights, optim = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
            if rank == 0:
                folder.mkdir(parents=True, exist_ok=True)
                torch.save({"state_dict": weights, "optimizer": optim}, folder / "full.ckpt")
            return None, None
        weights, optim = get_state_dict(model, opt)
        state = {"state_dict": weights, "optimizer_0": optim}
        if mode == "sharded":
            dcp.save(state, checkpoint_id=str(folder))
            return None, None
        if mode == "async":
            return dcp.async_save(state, checkpoint_id=str(folder), process_group=background), None
        response = dcp.async_save(state, checkpoint_id=str(folder), process_group=background, async_stager=stager)
        return response.upload_completion, response.staging_completion

    for mode in MODES:
        folder = Path(out_dir) / f"{size}-{mode}"
        # Memory: the save alone, to the end of its write.
        release_memory()
        dist.barrier()
        with PeakRSS() as rss:
            start = time.perf_counter()
            future, _ = save(mode, folder)
            if future is not None:
                rss.sample_until(future.done)
                future.result()
            total = time.perf_counter() - start
        dist.barrier()
        own = folder / ("full.ckpt" if mode == "gathered" else f"__{rank}_0.distcp")
        disk = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
        row[mode] = {"extra": rss.extra, "total": total, "own_bytes": own.stat().st_size if own.exists() else 0, "disk": disk}
        dist.barrier()
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        # Stall: a save at a step boundary and the training step after it.
        release_memory()
        dist.barrier()
        start = time.perf_counter()
        for _ in range(2):
            forward_backward()
            update()
        step_time = (time.perf_counter() - start) / 2
        dist.barrier()
        start = time.perf_counter()
        future, staged = save(mode, folder)
        stall = time.perf_counter() - start
        step_start = time.perf_counter()
        forward_backward()
        if staged is not None:
            wait = time.perf_counter()
            staged.result()  # the copy is complete before the optimizer changes the weights
            stall += time.perf_counter() - wait
        update()
        next_step = time.perf_counter() - step_start - (stall - (step_start - start))
        if future is not None:
            future.result()
        dist.barrier()
        if rank == 0:
            shutil.rmtree(folder, ignore_errors=True)
        row[mode].update(stall=stall, step=step_time, next_step=next_step)
    stager.close()
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
    return sorted(rows, key=lambda r: r["rank"])


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
    print(f"{'model':>6} {'params':>8} {'mode':>9} {'disk MB':>8} {'r0 shard MB':>11} {'r0 extra MB':>11} {'r1 extra MB':>11} {'r0 extra/shard':>14} {'stall s':>8} {'stall/sync':>10} {'write s':>8} {'step s':>7} {'next step s':>11}")
    for size in args.sizes.split(","):
        rows = run_size(size, args.world, out_dir)
        r0, r1 = rows[0], rows[1]
        shard = r0["sharded"]["own_bytes"]
        sync = r0["sharded"]["stall"]
        for mode in MODES:
            a, b = r0[mode], r1[mode]
            print(
                f"{size:>6} {r0['params'] / 1e6:>7.1f}M {mode:>9} {mb(a['disk']):>8} {mb(shard):>11} {mb(a['extra']):>11} {mb(b['extra']):>11} "
                f"{a['extra'] / shard:>14.2f} {a['stall']:>8.2f} {a['stall'] / sync:>10.2f} {a['total']:>8.2f} {a['step']:>7.2f} {a['next_step']:>11.2f}",
                flush=True,
            )
    shutil.rmtree(out_dir, ignore_errors=True)


if __name__ == "__main__":
    main()

"""The health check (`cluster.health_check`, `mode=health`): on every rank a short matmul against
what the device should give, a memory allocation, and one all-reduce's bus bandwidth; every rank
and node below its threshold is named, with the thresholds.

A rank's matmul is judged against the median of the *other* ranks (one slow GPU among healthy
ones: MIN_OF_OTHERS) and, on a GPU in the hardware table, against the table's dense peak
(GPU_MIN_OF_PEAK: a healthy GPU reaches well above it on a large bf16 matmul). On a CPU the same
code runs over gloo; only the relative threshold applies (CPU speeds differ too much for a table).
The all-reduce is one figure for the world (every rank takes part): judged against a floor per
device kind. Runs inside an initialized torch.distributed process group, or alone.
"""

from __future__ import annotations

import os
import socket
import statistics
import time

# A rank below this share of the other ranks' median matmul throughput is named. CPUs are shared
# with whatever else the machine runs (a CI worker beside another saw a healthy rank at 68%), so
# their bar is lower; a degraded GPU is slower by far more than 25%.
MIN_OF_OTHERS = {"cuda": 0.75, "cpu": 0.5}
GPU_MIN_OF_PEAK = 0.4  # and on a GPU below 40% of the table's dense bf16/fp16 peak
BUSBW_FLOOR_GBPS = {"cuda": 10.0, "cpu": 0.01}  # PCIe gen3 x16 is ~12 GB/s; gloo over loopback ~1 GB/s
MATMUL_N = {"cuda": 8192, "cpu": 384}
ALLREDUCE_BYTES = {"cuda": 256 * 2**20, "cpu": 8 * 2**20}
MEMORY_FRACTION = 0.8  # of the free GPU memory, allocated and written once


def one_matmul(a, b):
    return a @ b


def matmul_tflops(device, dtype, seconds: float) -> float:
    """Dense matmul throughput of this rank's device: n^3 products in a loop for about `seconds`."""
    import torch

    n = MATMUL_N[device.type]
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    one_matmul(a, b)  # warm-up (kernel choice, lazy init)
    sync(device)
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds or count < 3:
        one_matmul(a, b)
        count += 1
        if device.type == "cuda" and count % 10 == 0:
            sync(device)
    sync(device)
    return 2 * n**3 * count / (time.perf_counter() - started) / 1e12


def memory_check(device) -> tuple[bool, str]:
    """Allocate and write MEMORY_FRACTION of the free GPU memory once (a GPU with bad memory or
    another process on it fails here, not at step 1); on a CPU, 256 MB."""
    import torch

    if device.type != "cuda":
        torch.ones(64 * 2**20, dtype=torch.float32).sum()
        return True, "256 MB allocated and written"
    free, total = torch.cuda.mem_get_info(device)
    want = int(free * MEMORY_FRACTION)
    try:
        block = torch.empty(want, dtype=torch.uint8, device=device)
        block.fill_(1)
        sync(device)
        del block
    except RuntimeError as e:  # torch.OutOfMemoryError and driver errors
        return False, f"could not allocate {want / 2**30:.1f} of {free / 2**30:.1f} GiB free ({total / 2**30:.1f} GiB): {str(e).splitlines()[0]}"
    finally:
        torch.cuda.empty_cache()
    return True, f"{want / 2**30:.1f} GiB of {free / 2**30:.1f} GiB free allocated and written ({total / 2**30:.1f} GiB total)"


def allreduce_busbw(device, seconds: float) -> float:
    """Bus bandwidth of an all-reduce over the world, GB/s (nccl-tests' busbw: size x 2(n-1)/n / time)."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    nbytes = ALLREDUCE_BYTES[device.type]
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dist.all_reduce(x)  # warm-up: connections
    sync(device)
    # Every rank must run the same number of all-reduces (a rank leaving a time-bounded loop early
    # leaves the others waiting in one): two timed, then as many as fit the budget, agreed by MAX.
    started = time.perf_counter()
    for _ in range(2):
        dist.all_reduce(x)
    sync(device)
    per_call = (time.perf_counter() - started) / 2
    agreed = torch.tensor([max(2, int(seconds / max(per_call, 1e-6)))], dtype=torch.int64, device=device)
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    count, started = int(agreed), time.perf_counter()
    for _ in range(count):
        dist.all_reduce(x)
    sync(device)
    elapsed = time.perf_counter() - started
    # every rank's clock differs: the slowest rank's time is the world's
    t = torch.tensor([elapsed / count], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return nbytes * 2 * (world - 1) / world / float(t) / 1e9


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_world(device, dtype, budget_s: float, peak_tflops: float | None) -> dict:
    """Every rank measures; the results are gathered to every rank and judged alike."""
    import torch.distributed as dist

    distributed = dist.is_available() and dist.is_initialized()
    rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
    started = time.perf_counter()
    memory_ok, memory_note = memory_check(device)
    # Slurm's node name where there is one: what --exclude takes (it can differ from the hostname).
    host = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    mine = {"rank": rank, "host": host, "tflops": matmul_tflops(device, dtype, budget_s / 4), "memory_ok": memory_ok, "memory": memory_note}
    everyone = [None] * world
    if distributed:
        dist.all_gather_object(everyone, mine)
    else:
        everyone = [mine]
    busbw = allreduce_busbw(device, budget_s / 8) if distributed and world > 1 else None
    verdict = judge(everyone, busbw, device_type=device.type, peak_tflops=peak_tflops)
    verdict["seconds"] = time.perf_counter() - started
    return verdict


def judge(results: list[dict], busbw: float | None, *, device_type: str, peak_tflops: float | None) -> dict:
    """{"ranks", "busbw", "bad": [(rank, host, why)], "thresholds": [lines]}."""
    bad = []
    floor = GPU_MIN_OF_PEAK * peak_tflops if device_type == "cuda" and peak_tflops else None
    least = MIN_OF_OTHERS.get(device_type, MIN_OF_OTHERS["cuda"])
    for r in results:
        others = [o["tflops"] for o in results if o["rank"] != r["rank"]]
        reference = statistics.median(others) if others else None
        if reference and r["tflops"] < least * reference:
            bad.append((r["rank"], r["host"], f"matmul {r['tflops']:.3g} TFLOP/s, {100 * r['tflops'] / reference:.0f}% of the other ranks' median {reference:.3g}"))
        elif floor and r["tflops"] < floor:
            bad.append((r["rank"], r["host"], f"matmul {r['tflops']:.3g} TFLOP/s, below {floor:.3g} ({100 * GPU_MIN_OF_PEAK:.0f}% of the {peak_tflops:g} peak)"))
        if not r["memory_ok"]:
            bad.append((r["rank"], r["host"], f"memory: {r['memory']}"))
    bus_floor = BUSBW_FLOOR_GBPS[device_type]
    thresholds = [
        f"matmul ({MATMUL_N[device_type]}^3): at least {100 * least:.0f}% of the other ranks' median"
        + (f", and at least {floor:.3g} TFLOP/s ({100 * GPU_MIN_OF_PEAK:.0f}% of the {peak_tflops:g} TFLOP/s dense peak in the hardware table)" if floor else ""),
        f"memory: {'80% of the free GPU memory allocated and written' if device_type == 'cuda' else '256 MB allocated and written'}",
        f"all-reduce ({ALLREDUCE_BYTES[device_type] // 2**20} MB): bus bandwidth at least {bus_floor:g} GB/s",
    ]
    if busbw is not None and busbw < bus_floor:
        bad.append((-1, "all", f"all-reduce bus bandwidth {busbw:.3g} GB/s, below {bus_floor:g} GB/s: a slow link or interface (NCCL_SOCKET_IFNAME, NCCL_IB_HCA; mode=doctor lists them)"))
    return {"ranks": results, "busbw": busbw, "bad": bad, "thresholds": thresholds}


def bad_nodes(verdict: dict) -> list[str]:
    return sorted({host for rank, host, _ in verdict["bad"] if rank >= 0})


def render(verdict: dict) -> str:
    lines = [f"health     {len(verdict['ranks'])} rank(s) in {verdict.get('seconds', 0):.1f} s; thresholds:"]
    lines += [f"           {t}" for t in verdict["thresholds"]]
    for r in verdict["ranks"]:
        lines.append(f"           rank {r['rank']} ({r['host']}): matmul {r['tflops']:.3g} TFLOP/s; memory {'ok' if r['memory_ok'] else 'FAILED'}")
    if verdict["busbw"] is not None:
        lines.append(f"           all-reduce bus bandwidth {verdict['busbw']:.3g} GB/s")
    if verdict["bad"]:
        lines.append("health     BAD: " + "; ".join(f"rank {rank} on {host}: {why}" if rank >= 0 else why for rank, host, why in verdict["bad"]))
        if bad_nodes(verdict):
            lines.append(f"health     bad node(s): {','.join(bad_nodes(verdict))}")
    else:
        lines.append("health     ok: every rank and the all-reduce within the thresholds")
    return "\n".join(lines)


def act(verdict: dict, on_bad_node: str, job: str | None, requeues: bool = True) -> str:
    """What cluster.on_bad_node does with bad ranks: warn (the line), stop (TrainingStopped: exit 3)
    or, on Slurm, exclude their nodes and requeue the job (Preempted: exit 75). Every rank reaches
    the same verdict; only the one that `requeues` (rank 0) asks Slurm."""
    from tinytrain.cluster import slurm
    from tinytrain.errors import Preempted, TrainingStopped

    if not verdict["bad"]:
        return "ok"
    nodes = bad_nodes(verdict)
    named = "; ".join(f"rank {rank} on {host}: {why}" if rank >= 0 else why for rank, host, why in verdict["bad"])
    if on_bad_node == "warn":
        return f"health check: {named} (cluster.on_bad_node=warn: training anyway)"
    if on_bad_node == "exclude" and job and nodes:
        if not requeues:
            raise Preempted(f"tinytrain: health check: {named}; rank 0 requeues the job without {','.join(nodes)}")
        done, outcome = slurm.requeue_excluding(job, nodes)
        if done:
            raise Preempted(f"tinytrain: health check: {named}; {outcome}: the job runs again without {','.join(nodes)} (exit 75)")
        raise TrainingStopped(f"tinytrain: health check: {named}; excluding {','.join(nodes)} failed: {outcome}. Resubmit with sbatch --exclude={','.join(nodes)}")
    fix = f"resubmit with sbatch --exclude={','.join(nodes)} (or cluster.on_bad_node=exclude under Slurm)" if nodes else "check the interconnect settings (mode=doctor)"
    raise TrainingStopped(f"tinytrain: health check failed before training: {named}. Fix: {fix}; cluster.on_bad_node=warn trains anyway")

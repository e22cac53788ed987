"""trainer.micro_batch_size=auto: the micro batch (and, with trainer.activation_checkpointing=auto,
the checkpointing mode) chosen from the memory model, keeping the global batch by changing the
gradient accumulation.

The choice: the cheapest checkpointing mode (plan/checkpointing.py's BY_COST) under which some
micro batch fits, then the largest micro batch that fits under it. A micro batch fits when the
plan's per-GPU estimate stays below (1 - SAFETY_MARGIN) of the GPU's memory: the estimate leaves
out the CUDA context, NCCL's buffers and the allocator's fragmentation. Candidates are the
divisors of global batch / data parallel, so the global batch is kept exactly.
"""

from __future__ import annotations

from tinytrain.errors import Problem

AUTO = "auto"
SAFETY_MARGIN = 0.10  # of the GPU's memory, kept free of the estimate


def auto_limit_gib(gpu_memory_gib: float) -> float:
    """What every auto choice (the micro batch, the checkpointing mode, parallel.cp=null) lets
    the plan's estimate reach: the GPU's memory less SAFETY_MARGIN."""
    return (1 - SAFETY_MARGIN) * gpu_memory_gib


def is_auto(value) -> bool:
    return isinstance(value, str) and value.strip().lower() == AUTO


def configured(value) -> int | None:
    """The micro batch the config fixes, or None under auto."""
    return None if is_auto(value) else value


def problems(cfg, hardware) -> list[Problem]:
    """A micro batch that is neither a positive integer nor auto; auto without a global batch to
    keep or without a GPU whose memory it can fill (`hardware`: the one the run is planned for)."""
    t = cfg.trainer
    value = t.micro_batch_size
    if not is_auto(value):
        if isinstance(value, bool) or not isinstance(value, int):
            return [Problem("trainer.micro_batch_size", value, "must be a positive integer or auto", "use e.g. trainer.micro_batch_size=8, or auto (the largest that fits the GPU)")]
        if value < 1:
            return [Problem("trainer.micro_batch_size", value, "must be >= 1", "use a positive integer")]
        return []
    found = []
    if t.global_batch_size is None:
        found.append(Problem("trainer.micro_batch_size", AUTO, "keeps the global batch by changing the accumulation, and trainer.global_batch_size is not set", "set trainer.global_batch_size (e.g. 256), or a fixed trainer.micro_batch_size"))
    elif t.accumulate_grad_batches is not None:
        found.append(Problem("trainer.accumulate_grad_batches", t.accumulate_grad_batches, "is what trainer.micro_batch_size=auto decides", "leave trainer.accumulate_grad_batches=null under trainer.micro_batch_size=auto"))
    if hardware.is_cpu or not hardware.memory_gb:
        named = cfg.hardware.gpu and hardware.is_cpu  # a train run fits the GPU it runs on, not the one named
        where = f"a CPU: hardware.gpu={cfg.hardware.gpu} plans for that GPU in mode=plan, and a training run fits the one it runs on" if named else "a CPU" if hardware.is_cpu else hardware.name + " has no memory size in the hardware table"
        fix = "run it on the GPU node, or set a fixed trainer.micro_batch_size" if named else "name the GPU the run trains on (e.g. hardware.gpu=H100 with mode=plan), or set a fixed trainer.micro_batch_size"
        found.append(Problem("trainer.micro_batch_size", AUTO, f"fills a GPU's memory, and this run has no GPU to fit ({where})", fix))
    return found


def candidates(global_batch: int, data_parallel: int, smallest: int = 1) -> list[int]:
    """Micro batches of at least `smallest` that keep `global_batch` over `data_parallel` ranks
    exactly, ascending."""
    per_rank = global_batch // data_parallel
    return [m for m in range(smallest, per_rank + 1) if per_rank % m == 0]


def choose(table: list, modes: list, gpu_memory_gib: float) -> tuple[int, str, str]:
    """(micro batch, mode, reason) from `table` (ModeCost rows for each candidate x mode in `modes`,
    cheapest mode first). None fitting: the smallest candidate under the last mode (the memory line
    says by how much it misses)."""
    limit = auto_limit_gib(gpu_memory_gib)
    for mode in modes:
        fitting = [row for row in table if row.mode == mode and row.total_gib <= limit]
        if fitting:
            best = max(fitting, key=lambda row: row.micro_batch)
            reason = f"auto: the largest micro batch whose {best.total_gib:.1f} GiB stays under {limit:.1f} GiB ({100 * (1 - SAFETY_MARGIN):.0f}% of the GPU)"
            # Under checkpointing=auto a larger micro batch of a costlier mode may fit too: say why not.
            return best.micro_batch, mode, reason + (f", under {mode}: the cheapest checkpointing mode in which one does" if len(modes) > 1 else "")
    return min(row.micro_batch for row in table), modes[-1], f"auto: no micro batch fits under {limit:.1f} GiB ({100 * (1 - SAFETY_MARGIN):.0f}% of the GPU); the smallest is planned"

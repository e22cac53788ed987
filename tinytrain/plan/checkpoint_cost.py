"""A run's checkpoints in the plan: their format, and what they cost (disk, host memory, time).

format  the strategy's (plan/parallel.py's CheckpointFormat): `file` (single, ddp: one .ckpt),
        `deepspeed` (a folder of DeepSpeed's per-rank shards), `sharded` (fsdp_tp: a folder of DCP
        shards, one file per rank; checkpoint/sharded.py).

Size of one step checkpoint, per parameter P (the padded count the plan prints) and what holds it:
- single, ddp, fsdp_tp: Lightning keeps fp32 weights under every precision (mixed precision
  autocasts), so 4 B weights + 8 B Adam moments (fp32) = 12 B/P; fsdp_tp splits them evenly
  over its world (each rank writes world^-1 of them).
- DeepSpeed ZeRO-1/2: rank 0's module states hold the weights in the training dtype (2 B in
  bf16/fp16, 4 B in fp32); every rank's optimizer partition holds the fp32 master weights and
  the moments, 12 B/P over its partitions (every rank: dp x cp, since DeepSpeed partitions over
  a context-parallel group's ranks too): 14 or 16 B/P in all.
- ZeRO-3: the weights are partitioned (the module states hold none); the optimizer partitions
  hold fp32 master + moments: 12 B/P.
- LoRA: moments (and DeepSpeed's fp32 master) only for the trainable parameters.
Plus the rest (loops, callbacks, every rank's RNG states, DCP's index): a few KiB per rank.
tests/integration check the estimate against the checkpoints real runs write (within 10%).

Host memory one rank needs at most while saving (on GPUs: what is copied to host memory at once):
a file save streams tensor by tensor (the largest tensor); a sharded save the same, unless async,
which stages the rank's whole shard in host memory (held from the first async save to the end of the
run: each later save copies into the same buffers); DeepSpeed the rank's largest flat
partition (4 B/P over the partitions). Gathering on rank 0 (fsdp_tp before sharded saves) would need
the whole checkpoint there; the plan prints that figure beside it.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

from tinytrain.checkpoint.disk_space import nearest_existing
from tinytrain.checkpoint.files import step_checkpoints
from tinytrain.cluster.sbatch import MAX_SIGNAL_DELAY_S, slurm_time_seconds
from tinytrain.config.schema import Mode, Strategy
from tinytrain.errors import Problem
from tinytrain.plan.parallel import CheckpointFormat, strategy_row

GB = 1e9
# The rest: loops, callbacks, the LR schedule, tinytrain's metadata (rank 0) and each rank's RNG
# states, gathered into rank 0's part; DCP's index and DeepSpeed's client state per file.
REST_BYTES = 24_000
REST_PER_RANK = 12_000
# Model FLOPs utilisation assumed for the time between saves (a measured run logs its own MFU).
ASSUMED_MFU = 0.4


@dataclass(frozen=True)
class CheckpointPlan:
    format: str
    async_save: bool
    keep_last: int
    step_bytes: int = 0  # one step checkpoint on disk
    weights_bytes: int = 0
    optimizer_bytes: int = 0
    largest_rank_bytes: int = 0  # the largest part one rank writes
    save_host_bytes: int = 0  # host memory one rank needs at most while saving
    gathered_host_bytes: int = 0  # what gathering the state on rank 0 would need instead
    disk_needed_bytes: int = 0  # keep_last + 1 checkpoints (the newest is written before the oldest goes) + end_bytes
    end_bytes: int = 0  # what the run's end writes beside them: the export, DeepSpeed's consolidated weights
    free_bytes: int | None = None  # at run.root (None: could not be measured)
    save_seconds: float = 0.0  # one save at write_gbps
    between_saves_seconds: float | None = None  # trainer.checkpoint_every_n_steps steps at ASSUMED_MFU (None: no peak for this hardware)
    warnings: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {**asdict(self), "warnings": list(self.warnings)}


def step_checkpoint_bytes(strategy: Strategy, *, zero_stage: int, sixteen_bit: bool, params: int, trainable: int, world: int) -> tuple[int, int, int]:
    """(weights, optimizer state, rest) bytes of one step checkpoint."""
    rest = REST_BYTES + REST_PER_RANK * world
    if strategy_row(strategy).deepspeed:
        weights = 0 if zero_stage == 3 else (2 if sixteen_bit else 4) * params
        return weights, 12 * trainable, rest
    return 4 * params, 8 * trainable, rest


def largest_rank_bytes(strategy: Strategy, *, zero_stage: int, weights: int, optimizer: int, rest: int, world: int, partitions: int) -> int:
    row = strategy_row(strategy)
    if row.checkpoint_format is CheckpointFormat.sharded:
        return (weights + optimizer) // world + rest
    if row.deepspeed:
        return (weights if zero_stage < 3 else 0) + optimizer // partitions + rest  # rank 0: module states + its partition
    return weights + optimizer + rest


def save_host_bytes(strategy: Strategy, *, async_save: bool, rank_bytes: int, largest_tensor: int, trainable: int, partitions: int) -> int:
    row = strategy_row(strategy)
    if row.checkpoint_format is CheckpointFormat.sharded and async_save:
        return rank_bytes  # the staging copy of the whole shard
    if row.deepspeed:
        return max(largest_tensor, 4 * trainable // partitions)
    return largest_tensor


def free_space(run_dir: Path) -> int | None:
    """Free bytes on the filesystem the run directory is (or will be) on."""
    try:
        return shutil.disk_usage(nearest_existing(run_dir)).free
    except OSError:
        return None


def existing_bytes(checkpoint_dir: Path) -> int:
    """Bytes this run's step checkpoints already take (a resumed run replaces them as it goes)."""
    total = 0
    for _, path in step_checkpoints(checkpoint_dir):
        total += sum(p.stat().st_size for p in (path, *path.rglob("*")) if p.is_file())  # a file, or a folder's files
    return total


def end_of_run_bytes(cfg, strategy: Strategy, *, params: int, sixteen_bit: bool, run_dir: Path) -> int:
    """Beside the kept checkpoints and final.ckpt, the end of training writes the Hugging Face export
    (trainer.export: the weights in export.dtype, auto: the training precision's; counted where it
    lands on run.root's filesystem, not in an export.dir on another) and keeps a DeepSpeed run's
    consolidated fp32 weights (final.consolidated.ckpt, in checkpoints/), from which the export was made."""
    if not cfg.trainer.export:
        return 0
    dtype = getattr(cfg.export.dtype, "value", cfg.export.dtype)
    export = (4 if dtype == "fp32" or (dtype == "auto" and not sixteen_bit) else 2) * params
    if cfg.export.dir and not same_filesystem(Path(cfg.export.dir), run_dir):
        export = 0
    return export + (4 * params if strategy_row(strategy).deepspeed else 0)


def same_filesystem(a: Path, b: Path) -> bool:
    """Whether two paths (or, where they do not exist yet, their nearest existing folders) are on one filesystem."""
    try:
        return nearest_existing(a).stat().st_dev == nearest_existing(b).stat().st_dev
    except OSError:
        return True  # unknown: counted, as before


def human(n: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def disk_problem(cfg, *, step: int, needed: int, free: int | None, sixteen_bit: bool, end: int = 0) -> Problem | None:
    """run.root without room for keep_last + 1 checkpoints of `step` bytes each and the end of the
    run's `end` bytes (`needed`: all of it, less what the run's checkpoints already take)."""
    c, par = cfg.checkpoint, cfg.parallel
    if free is None or free >= needed:
        return None
    what = "the export and DeepSpeed's consolidated weights at the end" if strategy_row(par.strategy).deepspeed else "the export at the end"
    at_end = f" + {what} ({human(end)})" if end else ""
    fits = (free - end) // step - 1
    return Problem(
        "run.root",
        cfg.run.root,
        f"has {human(free)} free; {c.keep_last} kept checkpoints + the one being written{at_end} need {human(needed)} ({human(step)} each, parallel={par.name}, {'16-bit' if sixteen_bit else 'fp32'})",
        (f"keep fewer (checkpoint.keep_last={fits} fits), free space there, or point run.root at a larger filesystem" if fits >= 1 else f"free space there (even checkpoint.keep_last=1 needs {human(2 * step + end)}), or point run.root at a larger filesystem"),
    )


def checkpoint_plan(cfg, *, params: int, trainable: int, largest_tensor: int, world: int, partitions: int, sixteen_bit: bool, step_seconds: float | None, run_dir: Path, muon_params: int = 0, adapter_params: int = 0) -> CheckpointPlan:
    """The checkpoint line's numbers. A training run's disk that cannot hold keep_last + 1
    checkpoints is refused by the planner, beside the host memory refusal (disk_problem); other
    modes carry it as a warning. `adapter_params`: a LoRA run's, saved beside the base's weights
    (the export merges them into those)."""
    c, par = cfg.checkpoint, cfg.parallel
    strategy = par.strategy
    weights, optimizer, rest = step_checkpoint_bytes(strategy, zero_stage=par.zero_stage, sixteen_bit=sixteen_bit, params=params + adapter_params, trainable=trainable, world=world)
    optimizer -= 4 * muon_params  # trainer.optimizer=muon: one fp32 momentum, not two moments (plan/optimizer.py)
    step = weights + optimizer + rest
    rank = largest_rank_bytes(strategy, zero_stage=par.zero_stage, weights=weights, optimizer=optimizer, rest=rest, world=world, partitions=partitions)
    host = save_host_bytes(strategy, async_save=c.async_save, rank_bytes=rank, largest_tensor=largest_tensor, trainable=trainable, partitions=partitions)
    end = end_of_run_bytes(cfg, strategy, params=params, sixteen_bit=sixteen_bit, run_dir=run_dir)
    needed = max(step, (c.keep_last + 1) * step + end - existing_bytes(run_dir / "checkpoints"))
    free = free_space(run_dir)
    save_seconds = step / (c.write_gbps * GB)
    between = step_seconds * cfg.trainer.checkpoint_every_n_steps if step_seconds else None
    warnings = []
    if cfg.mode != Mode.train and (problem := disk_problem(cfg, step=step, needed=needed, free=free, sixteen_bit=sixteen_bit, end=end)):
        warnings.append(problem.render())  # planning for a cluster from elsewhere: said, not refused
    if between is not None and not c.async_save and save_seconds > c.max_save_share * between:
        warnings.append(
            f"a save takes ~{save_seconds:.0f} s at checkpoint.write_gbps={c.write_gbps:g}, {100 * save_seconds / between:.0f}% of the ~{between:.0f} s between saves "
            f"(more than checkpoint.max_save_share={c.max_save_share:g}): save less often (trainer.checkpoint_every_n_steps)"
            + (", or checkpoint.async_save=true" if strategy_row(strategy).checkpoint_format is CheckpointFormat.sharded else "")
        )
    if (late := requeue_save_warning(cfg, save_seconds=save_seconds, step_seconds=step_seconds)) is not None:
        warnings.append(late)
    return CheckpointPlan(
        strategy_row(strategy).checkpoint_format.value,
        bool(c.async_save),
        c.keep_last,
        step,
        weights,
        optimizer,
        rank,
        host,
        weights + optimizer + rest,
        needed,
        end,
        free,
        round(save_seconds, 3),
        round(between, 1) if between is not None else None,
        tuple(warnings),
    )


def requeue_save_warning(cfg, *, save_seconds: float, step_seconds: float | None) -> str | None:
    """On Slurm, USR1 comes cluster.signal_delay_s before the time limit (cluster/sbatch.py): the
    run finishes its step and saves before it requeues. A save that outlasts the delay is killed
    at the limit (the last complete checkpoint stays), and the job resumes from the previous one,
    losing the steps between. Said, not refused: write_gbps is the plan's assumption."""
    c = cfg.cluster
    needed = save_seconds + (step_seconds or 0.0)
    if c.name != "slurm" or needed <= c.signal_delay_s:
        return None
    step = f"the step under way (~{step_seconds:.0f} s) and " if step_seconds and step_seconds >= 1 else ""
    # The delay must stay below the job's time limit (sbatch_problems refuses one that is not).
    limit = slurm_time_seconds(str(c.time)) or MAX_SIGNAL_DELAY_S + 1
    room = min(MAX_SIGNAL_DELAY_S, limit - 1)
    suggested = min(room, math.ceil(2 * needed))
    fix = (
        f"raise cluster.signal_delay_s to {suggested}" + (" (twice that)" if suggested == math.ceil(2 * needed) else f" (the most below cluster.time={c.time})")
        if suggested >= needed
        else f"a longer cluster.time (no delay below {c.time} leaves room for it)"
    )
    return (
        f"cluster.signal_delay_s={c.signal_delay_s}: Slurm's USR1 comes {c.signal_delay_s} s before the time limit, and finishing {step}the save "
        f"(~{save_seconds:.0f} s at checkpoint.write_gbps={cfg.checkpoint.write_gbps:g}) takes ~{needed:.0f} s: the requeue's checkpoint would be cut off "
        f"and the job resume from the one before; {fix}, or set checkpoint.write_gbps to the disk's measured speed"
    )


def render(c: dict) -> list[str]:
    """The plan's checkpoint line (and its warnings)."""
    free = human(c["free_bytes"]) if c["free_bytes"] is not None else "unknown"
    how = {"file": "one file", "deepspeed": "DeepSpeed's shard folder", "sharded": "sharded folder, every rank its own file"}[c["format"]]
    gathered = f" (gathered on rank 0: {human(c['gathered_host_bytes'])})" if c["format"] == "sharded" else ""
    at_end = f" + {'export and consolidated weights' if c['format'] == 'deepspeed' else 'export'} {human(c['end_bytes'])}" if c.get("end_bytes") else ""
    lines = [
        f"checkpoint {how}{', async' if c['async_save'] else ''}: {human(c['step_bytes'])} per step checkpoint "
        f"(weights {human(c['weights_bytes'])} + optimizer {human(c['optimizer_bytes'])}), largest rank part {human(c['largest_rank_bytes'])}, "
        f"host memory at save <= {human(c['save_host_bytes'])} per rank{gathered}; keep_last {c['keep_last']} + 1 being written{at_end} = {human(c['disk_needed_bytes'])}, "
        f"{free} free at run.root; ~{c['save_seconds']:.1f} s per save"
        + (f", ~{c['between_saves_seconds']:.0f} s between saves" if c["between_saves_seconds"] is not None else "")
    ]
    lines += [f"           warning: {w}" for w in c["warnings"]]
    return lines

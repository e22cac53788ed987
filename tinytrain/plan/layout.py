"""The run's layout: processes per node, world size, and the batch arithmetic over them.

One owner: validate reports `batch_layout`'s problems; resolving uses its plan, unchecked again.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from tinytrain.cluster.sbatch import sbatch_problems
from tinytrain.cluster.slurm import allocation_problems, current_task
from tinytrain.config.schema import PLANNING_MODES, DataFormat, Mode, Objective
from tinytrain.data.batch_ramp import BatchRamp
from tinytrain.errors import Problem
from tinytrain.plan.micro_batch import is_auto
from tinytrain.plan.schedule import schedule_problems


@dataclass(frozen=True)
class BatchPlan:
    micro_batch_size: int
    accumulate_grad_batches: int
    data_parallel: int
    global_batch_size: int
    seq_len: int
    ramp: BatchRamp | None = None  # trainer.batch_size_warmup (data/batch_ramp.py)

    @property
    def tokens_per_step(self) -> int:
        """Tokens of a step at the final global batch (the ramp's steps hold fewer: `tokens_over`)."""
        return self.global_batch_size * self.seq_len

    def tokens_over(self, steps: int) -> int:
        """Tokens of the run's first `steps` steps, the batch warm-up's smaller steps counted as they are."""
        return self.ramp.samples_before(steps) * self.seq_len if self.ramp else self.tokens_per_step * steps


def devices_per_node(cfg) -> int:
    if cfg.cluster.devices is not None:
        return cfg.cluster.devices
    if cfg.mode in PLANNING_MODES and cfg.hardware.gpu:
        return 1
    import torch

    return max(torch.cuda.device_count(), 1)


def world_size(cfg) -> int:
    return cfg.cluster.nodes * devices_per_node(cfg)


def batch_layout(cfg, world: int, cp: int | None = None, micro: int | None = None) -> tuple[BatchPlan | None, list[Problem]]:
    """`cp`: the context-parallel size the plan decided; by default the configured one (null: 1,
    the strictest check of the batch: a larger cp only divides dp further). `micro`: the micro batch
    trainer.micro_batch_size=auto chose (plan/micro_batch.py); before it is chosen, auto is laid
    out at 1, which every global batch divisible by dp allows."""
    t = cfg.trainer
    tp = cfg.parallel.tp
    cp = cp or cfg.parallel.cp or 1
    problems = []
    if tp < 1 or world % tp:
        problems.append(
            Problem("parallel.tp", tp, f"must divide the world size {world} (nodes {cfg.cluster.nodes} x devices {devices_per_node(cfg)})", "choose a tp that divides the number of processes")
        )
        return None, problems
    if cp < 1:
        return None, problems  # plan/context.py names it
    if world % (tp * cp):
        # The ranks of one sequence share its batch: data parallelism is world / (tp x cp).
        fix = "choose a cp that divides the number of processes" + (f" / tp ({world // tp})" if tp > 1 else "") + ", or parallel.cp=1"
        if tp > 1 and world % cp == 0:
            fix += f"; or keep cp {cp} with parallel.tp={world // cp}"  # fsdp_tp's default tp is 2
        problems.append(Problem("parallel.cp", cp, f"tp({tp}) x cp({cp}) must divide the world size {world} (nodes {cfg.cluster.nodes} x devices {devices_per_node(cfg)})", fix))
        return None, problems
    dp = world // (tp * cp)
    # Under auto the micro batch is chosen later (planner.fit_stage): laid out at 1 until then, and
    # a batch warm-up's unit (dp x accumulation) checked at the one chosen, not at the placeholder.
    auto_pending = micro is None and is_auto(t.micro_batch_size)
    if micro is None:
        micro = 1 if is_auto(t.micro_batch_size) else t.micro_batch_size
    if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
        return None, problems  # plan/micro_batch.py names it
    if t.global_batch_size is None:
        accum = t.accumulate_grad_batches or 1
        return with_ramp(cfg, BatchPlan(micro, accum, dp, micro * dp * accum, cfg.data.seq_len), problems)
    per_step = micro * dp
    if t.global_batch_size % per_step:
        problems.append(
            Problem(
                "trainer.global_batch_size",
                t.global_batch_size,
                f"not a multiple of data_parallel({dp}): every rank takes the same micro batches (trainer.micro_batch_size=auto chooses one that divides its share)" if auto_pending else f"not a multiple of micro_batch_size({micro}) x data_parallel({dp}) = {per_step}",
                f"use a multiple of {per_step}" if auto_pending else f"use a multiple of {per_step}, or change trainer.micro_batch_size",
            )
        )
        return None, problems
    accum = t.global_batch_size // per_step
    if t.accumulate_grad_batches is not None and t.accumulate_grad_batches != accum:
        problems.append(
            Problem(
                "trainer.accumulate_grad_batches",
                t.accumulate_grad_batches,
                f"disagrees with global_batch_size({t.global_batch_size}) / (micro_batch_size({micro}) x data_parallel({dp})) = {accum}",
                "set only one of trainer.global_batch_size and trainer.accumulate_grad_batches",
            )
        )
        return None, problems
    batch = BatchPlan(micro, accum, dp, t.global_batch_size, cfg.data.seq_len)
    return (batch, problems) if auto_pending else with_ramp(cfg, batch, problems)


def larger_micro_batch(cfg, batch: BatchPlan) -> str:
    """Overrides that give a warm-up at micro batch 1 a start: micro batch 2 (or the smallest that
    divides the accumulation trainer.global_batch_size sets) and a start one step unit."""
    t, dp, accum = cfg.trainer, batch.data_parallel, batch.accumulate_grad_batches
    if t.global_batch_size is None:  # the final batch grows with the micro batch
        return f"trainer.micro_batch_size=2 trainer.batch_size_warmup.start={dp * accum} (final global batch {2 * dp * accum})"
    micro = next((m for m in range(2, accum + 1) if accum % m == 0), None)
    if micro is None:  # accumulation 1: the global batch is one micro batch per rank, and grows with it
        return f"trainer.micro_batch_size=2 trainer.global_batch_size={2 * t.global_batch_size} trainer.batch_size_warmup.start={t.global_batch_size}"
    accumulation = f" trainer.accumulate_grad_batches={accum // micro}" if t.accumulate_grad_batches is not None else ""
    return f"trainer.micro_batch_size={micro}{accumulation} trainer.batch_size_warmup.start={dp * accum // micro}"


def with_ramp(cfg, batch: BatchPlan, problems: list[Problem]) -> tuple[BatchPlan | None, list[Problem]]:
    """The batch with trainer.batch_size_warmup's ramp, or its problems."""
    w, d = cfg.trainer.batch_size_warmup, cfg.data
    if w.start is None:
        if w.tokens:
            problems.append(Problem("trainer.batch_size_warmup.tokens", w.tokens, "a warm-up length without a starting batch does nothing", "set trainer.batch_size_warmup.start=<sequences>, or trainer.batch_size_warmup.tokens=0"))
        return batch, problems
    unit, final = batch.data_parallel * batch.accumulate_grad_batches, batch.global_batch_size
    found = []
    if batch.micro_batch_size == 1 and w.start >= 1:
        # The ramp grows the micro batch (start / unit up to the final one): none below 1 exists.
        found.append(Problem("trainer.batch_size_warmup.start", w.start, f"a batch warm-up grows the micro batch, and at trainer.micro_batch_size=1 no start below the final global batch ({final}) is a multiple of data_parallel({batch.data_parallel}) x accumulate_grad_batches({batch.accumulate_grad_batches}) = {unit}", f"raise trainer.micro_batch_size, e.g. {larger_micro_batch(cfg, batch)}, or drop the warm-up (trainer.batch_size_warmup.start=null)"))
    elif w.start < 1 or w.start >= final:
        found.append(Problem("trainer.batch_size_warmup.start", w.start, f"must be at least 1 and below the final global batch ({final} = micro {batch.micro_batch_size} x accumulation {batch.accumulate_grad_batches} x dp {batch.data_parallel})", f"use a start between {unit} and {final - unit}, or raise trainer.global_batch_size"))
    elif w.start % unit:
        found.append(Problem("trainer.batch_size_warmup.start", w.start, f"not a multiple of data_parallel({batch.data_parallel}) x accumulate_grad_batches({batch.accumulate_grad_batches}) = {unit}: every rank's micro batches of a step must be one size", f"use a multiple of {unit}, e.g. trainer.batch_size_warmup.start={max(unit, w.start // unit * unit)}"))
    elif cfg.finetune.objective == Objective.kto and w.start // unit < 2:
        # The micro batch the plan checks is the final one; the warm-up's first steps train start / unit.
        fix = f"use trainer.batch_size_warmup.start={2 * unit} or more" if 2 * unit < final else f"raise trainer.micro_batch_size to 3 or more (now {batch.micro_batch_size}; the warm-up's micro batches of 2 must stay below it) with trainer.batch_size_warmup.start={2 * unit}, or drop the warm-up (trainer.batch_size_warmup.start=null)"
        found.append(Problem("trainer.batch_size_warmup.start", w.start, f"gives micro batches of {w.start // unit} example at first (start / data_parallel({batch.data_parallel}) x accumulate_grad_batches({batch.accumulate_grad_batches})), and kto estimates its KL term from each prompt paired with another example's completion in the same micro batch", fix))
    if w.tokens < 1:
        found.append(Problem("trainer.batch_size_warmup.tokens", w.tokens, "the warm-up needs a length in tokens", f"use e.g. trainer.batch_size_warmup.tokens={20 * final * batch.seq_len} (20 final-batch steps)"))
    if d.sources:
        found.append(Problem("trainer.batch_size_warmup.start", w.start, "a batch warm-up is not built for a data mixture (data.sources: its stages count steps of one batch size)", "set trainer.batch_size_warmup.start=null, or train one source"))
    elif d.format != DataFormat.text and d.group_by_length:
        found.append(Problem("data.group_by_length", True, "length-grouped batches are cut at one size; a batch warm-up changes it every few steps", "set data.group_by_length=false with trainer.batch_size_warmup"))
    if found:
        return None, problems + found + schedule_problems(cfg.trainer)
    ramp = BatchRamp.over_tokens(w.start, final, unit, w.tokens, batch.seq_len)
    steps = cfg.trainer.max_steps
    # Cheap first (a run trains fewer than max_steps final batches), then the ramp's steps counted.
    if ramp.samples >= steps * final or len(ramp.steps) >= steps:
        run_tokens = steps * final * batch.seq_len
        return None, [*problems, Problem("trainer.batch_size_warmup.tokens", w.tokens, f"the batch would still be growing at trainer.max_steps={steps}: the run never trains at its global batch of {final}", f"use a ramp well inside the run, e.g. trainer.batch_size_warmup.tokens={run_tokens // 4} (a quarter of the {run_tokens:,} tokens of {steps} full steps)")]
    # The schedule counts tokens: a decay must fit in the run's tokens, fewer than max_steps final batches.
    decay = schedule_problems(cfg.trainer, total=ramp.equivalent_step(cfg.trainer.max_steps))
    if decay:
        return None, problems + decay
    return BatchPlan(batch.micro_batch_size, batch.accumulate_grad_batches, batch.data_parallel, final, batch.seq_len, ramp), problems


def cluster_problems(cfg) -> list[Problem]:
    c = cfg.cluster
    problems = []
    if c.nodes < 1:
        problems.append(Problem("cluster.nodes", c.nodes, "must be >= 1", "use cluster.nodes=1 for one machine"))
    if c.devices is not None and c.devices < 1:
        problems.append(Problem("cluster.devices", c.devices, "must be >= 1 (processes per node)", "use the GPUs per node, 1 on a CPU, or null for every visible GPU"))
    return problems


def slurm_problems(cfg) -> list[Problem]:
    """mode=sbatch needs the Slurm settings; inside a Slurm job, training needs the config's
    nodes x devices to be the job's tasks."""
    if cfg.mode == Mode.sbatch:
        return sbatch_problems(cfg)
    task = current_task()
    if cfg.mode != Mode.train:
        return []
    if task is None:
        return other_nodes_problems(cfg) + launcher_world_problems(cfg) + one_node_rendezvous_problems(cfg)
    return allocation_problems(cfg.cluster.nodes, devices_per_node(cfg), cfg.cluster.name, task)


# What a launcher that starts every node's processes sets (torchrun; Lightning's own multi-node
# setup: NODE_RANK and MASTER_ADDR by hand).
NODE_LAUNCHER_VARIABLES = ("TORCHELASTIC_RUN_ID", "GROUP_RANK", "NODE_RANK", "MASTER_ADDR")


def other_nodes_problems(cfg) -> list[Problem]:
    """Training on cluster.nodes > 1 outside Slurm without a launcher: Lightning would wait for the
    other nodes' ranks, which nothing starts, until the startup watchdog gives up (30 minutes by
    default), in a rendezvous that Ctrl-C does not interrupt."""
    if cfg.cluster.nodes <= 1 or any(v in os.environ for v in NODE_LAUNCHER_VARIABLES):
        return []
    return [Problem("cluster.nodes", cfg.cluster.nodes, "asks for other nodes' processes, and nothing here starts them: no Slurm job, no torchrun (or NODE_RANK and MASTER_ADDR) on this machine", "submit it to Slurm (cluster=slurm, mode=sbatch), run `torchrun --nnodes ...` on each node, or train on this machine with cluster.nodes=1")]


def launcher_world_problems(cfg, env=os.environ) -> list[Problem]:
    """A launcher that starts the ranks itself (torchrun; a pod's RANK and WORLD_SIZE) says the
    world in WORLD_SIZE: one that is not the plan's nodes x devices ran a world of 2 on a plan of
    1 (every rank a whole run of its own, into one directory) or stopped in Lightning's traceback
    after the data was built. Lightning's own launcher sets it to the plan's world."""
    said = env.get("WORLD_SIZE")
    if said is None or not said.isdigit():
        return []
    if "RANK" in env and "LOCAL_RANK" not in env and devices_per_node(cfg) > 1:
        # Lightning's launcher starts this node's other ranks itself, each inheriting RANK: they
        # took rank 0's part (its run lock: its own parent's), and Lightning killed them all (137).
        return [Problem("RANK", env["RANK"], f"is set beside WORLD_SIZE={said} without LOCAL_RANK, and cluster.devices={devices_per_node(cfg)}: Lightning's launcher would start this node's other ranks, each reading RANK={env['RANK']} as its own", "start the ranks with torchrun (which sets RANK and LOCAL_RANK for each), or unset RANK and WORLD_SIZE and let Lightning start them")]
    planned = world_size(cfg)
    if int(said) == planned:
        return []
    per_node = env.get("LOCAL_WORLD_SIZE")
    fix = (
        f"make the config's world the launcher's: cluster.nodes={int(said) // int(per_node)} cluster.devices={per_node} (torchrun's --nnodes and --nproc-per-node) with a multi-process strategy (parallel=ddp, zero2, ...)"
        if per_node and per_node.isdigit() and int(per_node) > 0 and int(said) % int(per_node) == 0
        else "make cluster.nodes x cluster.devices the launcher's world, or unset WORLD_SIZE where no launcher starts this process"
    )
    return [Problem("cluster.devices", cfg.cluster.devices, f"plans a world of {planned} (cluster.nodes={cfg.cluster.nodes} x {devices_per_node(cfg)} per node), and the launcher that started this process says WORLD_SIZE={said}", fix)]


def one_node_rendezvous_problems(cfg, env=os.environ) -> list[Problem]:
    """Variables a shell kept from another job, on a run of this machine's ranks: NODE_RANK=1 made
    them ranks 2 and 3 of a world of 2, and a MASTER_ADDR of another host had rank 0 wait for
    itself there; either waited for the start-up limit (30 minutes by default) in a rendezvous."""
    if cfg.cluster.nodes != 1 or world_size(cfg) <= 1 or env.get("TORCHELASTIC_RUN_ID"):
        return []
    problems = []
    for var in ("NODE_RANK", "GROUP_RANK"):
        if env.get(var, "0").strip() not in ("", "0"):
            problems.append(Problem(var, env[var], "is set in the environment, and cluster.nodes=1 trains on this machine only: its ranks would number past the world and wait for the others", f"unset {var}, or set cluster.nodes to the launcher's node count"))
    address = env.get("MASTER_ADDR")
    if address and not local_address(address):
        problems.append(Problem("MASTER_ADDR", address, "is set in the environment and is not an address of this machine, where cluster.nodes=1 trains: rank 0 would wait for itself there", "unset MASTER_ADDR (the ranks then meet on this machine), or set it to this machine's address"))
    return problems


def local_address(address: str) -> bool:
    """Whether rank 0 could listen on `address` here (binding succeeds for this machine's own)."""
    import socket

    try:
        infos = socket.getaddrinfo(address, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as probe:
                probe.bind((sockaddr[0], 0, *sockaddr[2:]))  # an IPv6 link-local address needs its scope id
                return True
        except OSError:
            continue
    return False

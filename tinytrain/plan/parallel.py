"""What tinytrain knows about each parallel strategy (`parallel.strategy`), as plan/families.py is
for model families: one row per strategy holds its validation, its memory formula, its checkpoint
format and what it resumes from, the fast paths and fine-tuning it allows, and the traits the
other stages branch on. Other files ask `strategy_row(...)` (or `plan.parallel.row`) instead of
comparing strategy names.

A new strategy is a `Strategy` member (config/schema.py) with its conf/parallel/<name>.yaml, a row
here, and its Lightning strategy in train/strategy.py's BUILDERS; tests/unit/plan/test_parallel.py
fails while one of them is missing.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from tinytrain.checkpoint.formats import CheckpointFormat  # the format table: how each is read, on disk
from tinytrain.config.schema import Mode, Strategy
from tinytrain.errors import Problem
from tinytrain.plan import deepspeed_config
from tinytrain.plan.families import tp_problems
from tinytrain.plan.layout import batch_layout, devices_per_node, world_size
from tinytrain.plan.memory import (
    AdapterStates,
    ModelStateMemory,
    StateLayout,
    deepspeed_adapter_states,
    deepspeed_frozen_copy,
    deepspeed_states,
    local_adapter_states,
    replicated_frozen_copy,
    replicated_states,
    sharded_frozen_copy,
    sharded_states,
)
from tinytrain.plan.pretrained_shape import source as model_source


def no_problems(cfg, world: int) -> list[Problem]:
    return []


@dataclass(frozen=True)
class StrategyRow:
    strategy: Strategy
    # -- validation: the layouts it runs (parallel_problems asks these, then `problems`)
    one_process: bool  # the cluster must run one process
    tensor_parallel: bool  # parallel.tp > 1 shards the projections (the module parallelizes in configure_model)
    problems: Callable  # (cfg, world) -> [Problem]: the strategy's own settings
    # -- memory: per-GPU model states, full training and with a frozen LoRA base (plan/memory.py)
    model_states: Callable  # (params, StateLayout) -> ModelStateMemory
    adapter_states: Callable  # (AdapterStates, StateLayout) -> ModelStateMemory
    frozen_copy_bytes: Callable  # (params, StateLayout) -> bytes of a frozen copy held like the policy (a preference reference)
    # -- checkpoints: what it writes, and the formats a run under it can resume from
    checkpoint_format: CheckpointFormat
    resumable_from: frozenset
    # -- the engine: DeepSpeed's drives the step (the generated config; it clips gradients, holds
    # the fp16 loss scale, casts the model, offloads through DeepSpeedCPUAdam; the deepspeed extra)
    deepspeed: bool
    rank0_holds_model: bool  # rank 0's module holds every weight (sample generations need it)
    # -- fast paths: why each is off under it (None: allowed)
    fused_adamw: bool  # torch's fused AdamW on CUDA (plain tensors: not DeepSpeed's, not DTensors)
    liger_off: str | None  # liger-kernel's Triton kernels
    # -- fine-tuning
    lora_off: str | None  # why peft's LoRA layers cannot wrap its projections
    qlora: bool  # bitsandbytes' packed 4-bit base survives it
    # -- long context (parallel.cp > 1): the kinds of sequence split it runs, or why none
    cp_kinds: tuple = ()  # ContextParallelKind values, the first is what cp_kind=auto picks
    cp_off: str | None = None
    # -- throughput levers (plan/levers.py, plan/checkpointing.py): why each is refused, None: allowed
    compile_blocks_off: str | None = None  # trainer.compile=blocks
    compile_model_off: str | None = None  # trainer.compile=model
    # (zero_stage) -> why selective checkpointing's op-level policy cannot run, or None; where it
    # cannot, selective checkpoints every SELECTIVE_EVERY-th block in full instead (ZeRO-3 could not
    # while it gathered weights inside a layer: model/zero3_layers.py)
    op_checkpoint_off: Callable = lambda zero_stage: None
    fp8_off: str | None = None  # precision.fp8: torchao's Float8Linear layers
    finetune_problems: Callable = lambda cfg: []  # (cfg) -> [Problem], beyond the two above
    # -- memory through a step (plan/step_peak.py): what holds the gradients from one step into the
    # next forward, or None where they are freed with each optimizer step (model/module.py)
    gradient_buffers: str | None = None


def fsdp_tp_problems(cfg, world: int) -> list[Problem]:
    par = cfg.parallel
    problems = []
    cp = par.cp or 1
    if par.dp is not None and par.dp * par.tp * cp != world:
        problems.append(Problem("parallel.dp", par.dp, f"dp({par.dp}) x tp({par.tp}) x cp({cp}) must equal the world size {world} (nodes {cfg.cluster.nodes} x devices {devices_per_node(cfg)})", "leave parallel.dp=null to derive it"))
    if cfg.model.tie_word_embeddings:
        problems.append(Problem("model.tie_word_embeddings", True, f"parallel=fsdp_tp does not shard tied embeddings ({model_source(cfg.model)})", "use parallel=ddp or zero2/zero3 for this model"))
    if not cfg.model.pretrained:  # a pretrained model's family is checked on the built model
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        arch = cfg.model.arch.value
        problems += tp_problems(CONFIG_MAPPING[arch].base_model_tp_plan, arch)
    return problems


def deepspeed_problems(cfg, world: int) -> list[Problem]:
    return deepspeed_config.stage_problems(cfg.parallel, cfg.mode == Mode.train)


def deepspeed_finetune_problems(cfg) -> list[Problem]:
    return deepspeed_config.finetune_problems(cfg.parallel, cfg.finetune)


FILE_FORMATS = frozenset({CheckpointFormat.file})
LORA_TP = "peft's LoRA layers wrap the projections that tensor parallelism shards column- and row-wise, and peft does not shard them"
SINGLE = StrategyRow(
    Strategy.single,
    one_process=True,
    tensor_parallel=False,
    problems=no_problems,
    model_states=replicated_states,
    frozen_copy_bytes=replicated_frozen_copy,
    adapter_states=local_adapter_states,
    checkpoint_format=CheckpointFormat.file,
    resumable_from=FILE_FORMATS,
    deepspeed=False,
    rank0_holds_model=True,
    fused_adamw=True,
    liger_off=None,
    lora_off=None,
    qlora=True,
    cp_off="it runs one process, and a split sequence needs several",
)

# Ulysses runs inside DeepSpeed's engine (deepspeed.runtime.sequence_parallel): its attention's
# all-to-all needs deepspeed.comm, which torch DDP does not start.
DDP_CP_OFF = "DeepSpeed's Ulysses attention runs under its own engine, and ddp is torch's DistributedDataParallel; parallel=zero1 is the same data parallelism (optimizer states sharded) with Ulysses"
# FSDP2 gathers and frees each block's weights in hooks around it; torch compiles an FSDP2 model
# block by block (as torchtitan does), not as one graph.
FSDP_WHOLE_GRAPH = "FSDP2 gathers each block's weights in hooks around the block, which one whole-model graph would have to hold; torch compiles FSDP2 models block by block"

# Under DeepSpeed and fsdp_tp rank 0 holds a partition only.
STRATEGIES = {
    Strategy.single: SINGLE,
    # single's row, on several processes
    Strategy.ddp: replace(SINGLE, strategy=Strategy.ddp, one_process=False, cp_off=DDP_CP_OFF, gradient_buffers="DDP's gradient buckets hold the gradients through the run"),
    Strategy.deepspeed: StrategyRow(
        Strategy.deepspeed,
        one_process=False,
        tensor_parallel=False,
        problems=deepspeed_problems,
        model_states=deepspeed_states,
        frozen_copy_bytes=deepspeed_frozen_copy,
        adapter_states=deepspeed_adapter_states,
        checkpoint_format=CheckpointFormat.deepspeed,
        resumable_from=frozenset({CheckpointFormat.deepspeed}),
        deepspeed=True,
        rank0_holds_model=False,
        fused_adamw=False,
        liger_off=None,
        lora_off=None,
        qlora=False,
        cp_kinds=("ulysses",),
        fp8_off="DeepSpeed casts and partitions the weights inside its engine, and torchao's float8 layers are not checked under it",
        finetune_problems=deepspeed_finetune_problems,
        gradient_buffers="DeepSpeed's flat gradient buffers hold the gradients through the run",
    ),
    Strategy.fsdp_tp: StrategyRow(
        Strategy.fsdp_tp,
        one_process=False,
        tensor_parallel=True,
        problems=fsdp_tp_problems,
        model_states=sharded_states,
        frozen_copy_bytes=sharded_frozen_copy,
        adapter_states=local_adapter_states,  # unused: LoRA is refused under it
        checkpoint_format=CheckpointFormat.sharded,
        resumable_from=frozenset({CheckpointFormat.sharded, CheckpointFormat.file}),  # earlier runs' gathered files too
        deepspeed=False,
        rank0_holds_model=False,
        fused_adamw=False,
        liger_off="fsdp_tp: the kernels are not checked on tensor-parallel (DTensor) weights",
        lora_off=LORA_TP,
        qlora=False,
        # Ulysses with tp 1 (FSDP shards over the cp ranks too); ring (dp x cp x tp) where Ulysses
        # cannot (plan/context.py choose_kind).
        cp_kinds=("ulysses", "ring"),
        compile_model_off=FSDP_WHOLE_GRAPH,
        fp8_off="parallel=fsdp_tp has no float8 path: tensor parallelism would need torchao's float8 parallel styles for the sharded projections, which tinytrain's TP plan does not use, and float8 under FSDP2's shards (tp 1 too) is not checked",
    ),
}


def strategy_row(strategy: Strategy | str) -> StrategyRow:
    return STRATEGIES[Strategy(strategy)]


def state_layout(par, world: int, largest_layer_params: int = 0, buckets: float = 0.0, fp32: bool = False) -> StateLayout:
    """`par`: cfg.parallel (or anything with tp, zero_stage and the offload flags); `buckets`: bytes of
    ZeRO's reduce buckets (planner.ds_buckets); `fp32`: the run trains in fp32."""
    return StateLayout(world=world, tp=par.tp, zero_stage=par.zero_stage, offload_optimizer=par.offload_optimizer, offload_params=par.offload_params, largest_layer_params=largest_layer_params, buckets=buckets, fp32=fp32)


def model_state_memory(strategy: Strategy | str, params: int, *, world: int, tp: int, zero_stage: int = 0, offload_optimizer: bool = False, offload_params: bool = False, largest_layer_params: int = 0) -> ModelStateMemory:
    """Bytes per GPU for parameters, gradients and optimizer state under `strategy`."""
    layout = StateLayout(world=world, tp=tp, zero_stage=zero_stage, offload_optimizer=offload_optimizer, offload_params=offload_params, largest_layer_params=largest_layer_params)
    return strategy_row(strategy).model_states(params, layout)


def adapter_state_memory(strategy: Strategy | str, states: AdapterStates, layout: StateLayout) -> ModelStateMemory:
    return strategy_row(strategy).adapter_states(states, layout)


def parallel_problems(cfg) -> list[Problem]:
    """The strategy's layout, its own settings and the batch arithmetic over the world size."""
    par = cfg.parallel
    row = strategy_row(par.strategy)
    problems = deepspeed_config.override_problems(par, row.deepspeed)
    if problems:
        return problems
    if par.tp > 1 and not row.tensor_parallel:
        # Batch arithmetic depends on tp, so it is checked once tp is possible at all.
        fix = "use parallel.tp=1, or parallel=fsdp_tp for tensor parallelism"
        return [Problem("parallel.tp", par.tp, f"parallel={par.name} has no tensor parallelism", fix)]
    world = world_size(cfg)
    problems += row.problems(cfg, world)
    if row.one_process and world > 1:
        c = cfg.cluster
        one = " and ".join(f"cluster.{key}=1" for key in ("nodes", "devices") if getattr(c, key) not in (None, 1))
        problems.append(Problem("parallel", par.name, f"runs one process but the cluster has {world} (nodes {c.nodes} x devices {'null: every GPU' if c.devices is None else c.devices})", f"use parallel=ddp, or {one or 'one process'}"))
    if (par.cp or 1) > 1 and not row.cp_kinds:
        return problems  # plan/context.py names the strategy; the batch over cp would only repeat it
    # cp=null: the plan chooses cp, and data parallelism with it (world / (tp x cp)). The batch is
    # checked at the cp chosen (plan/planner.py); here only refused, at the first, when no cp lays it out.
    checks = [batch_layout(cfg, world, cp)[1] for cp in batch_cps(cfg, world)]
    return problems + (checks[0] if all(checks) else [])


def batch_cps(cfg, world: int) -> list[int]:
    """The cps the batch may be laid out over: the configured one; for cp=null 1 under a strategy
    without context parallelism, else every power of two of world / tp, smallest first."""
    par = cfg.parallel
    if par.cp is not None:
        return [par.cp]
    return power_of_two_divisors(world // max(par.tp, 1)) if strategy_row(par.strategy).cp_kinds else [1]


def unplanned_batch(cfg, world: int):
    """The batch of a mode that makes no plan (mode=prepare): over the first of batch_cps that lays
    the global batch out (validate refused it when none does)."""
    return next((batch for batch, problems in (batch_layout(cfg, world, cp) for cp in batch_cps(cfg, world)) if not problems), None)


def power_of_two_divisors(n: int) -> list[int]:
    """1, 2, 4, ... up to n, those that divide it: the cps a plan may choose (plan/context.py narrows them)."""
    return [1 << k for k in range(max(n, 1).bit_length()) if n % (1 << k) == 0]


def checkpoint_problems(cfg) -> list[Problem]:
    """checkpoint.async_save writes a sharded checkpoint in the background: only a strategy whose
    checkpoints are sharded has one to write."""
    par = cfg.parallel
    if not cfg.checkpoint.async_save or strategy_row(par.strategy).checkpoint_format is CheckpointFormat.sharded:
        return []
    sharded = " or ".join(f"parallel={s.value}" for s, r in STRATEGIES.items() if r.checkpoint_format is CheckpointFormat.sharded)
    return [Problem("checkpoint.async_save", True, f"writes sharded checkpoints in the background, which only {sharded} saves (this run: parallel={par.name})", f"drop checkpoint.async_save, or train with {sharded}")]


def tp_model_problems(cfg) -> list[Problem]:
    """parallel.tp against the model's heads (each rank takes whole heads)."""
    m, tp = cfg.model, cfg.parallel.tp
    if m.num_heads < 1 or m.num_kv_heads < 1:
        return []  # plan/families.py's model_problems names them
    if tp < 1:
        return [Problem("parallel.tp", tp, "must be >= 1", "use parallel.tp=1 for no tensor parallelism")]
    problems = []
    if m.num_heads % tp:
        problems.append(Problem("parallel.tp", tp, f"tp({tp}) must divide num_heads({m.num_heads}) of {model_source(m)}", f"use a tp that divides {m.num_heads}"))
    if m.num_kv_heads % tp:
        problems.append(Problem("parallel.tp", tp, f"tp({tp}) must divide num_kv_heads({m.num_kv_heads}) of {model_source(m)}", f"use a tp that divides {m.num_kv_heads}"))
    return problems


def lora_problems(cfg, key: str) -> list[Problem]:
    """What the strategy allows of finetune=lora|qlora (`key`: "finetune=<method>")."""
    row = strategy_row(cfg.parallel.strategy)
    found = []
    if row.lora_off:
        found.append(Problem("parallel", cfg.parallel.name, f"{key}: {row.lora_off}", "use parallel=ddp, zero2 or zero3 (ZeRO-3 partitions a base too large for one GPU)"))
    return found + row.finetune_problems(cfg)


def finetune_refuses(cfg) -> bool:
    """Whether finetune=lora|qlora refuses cfg.parallel (lora_problems, qlora_problems): the
    strategies a fix may name to such a run."""
    method = cfg.finetune.method.value
    if method == "full":
        return False
    return bool(lora_problems(cfg, f"finetune={method}") or (method == "qlora" and qlora_problems(cfg)))


def qlora_problems(cfg) -> list[Problem]:
    if strategy_row(cfg.parallel.strategy).qlora:
        return []
    runs = " or ".join(s.value for s, r in STRATEGIES.items() if r.qlora)
    return [Problem("parallel", cfg.parallel.name, f"finetune=qlora runs on {runs}: DeepSpeed would re-partition and re-cast bitsandbytes' packed 4-bit weights", "use parallel=single or parallel=ddp (a 4-bit 7B base fits one GPU)")]

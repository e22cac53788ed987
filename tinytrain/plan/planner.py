"""The planning stage: a validated config and its tokenizer -> the frozen RunPlan.

Each derived value is decided here once, by the module that owns it: hardware, precision and
vocab (resolve.py), world size and batch (layout.py), attention (attention.py), model shape and
memory, fast paths, the DeepSpeed config, where the run starts (start_points.py) and the
preflight checks (preflight.py). Nothing here allocates weights or imports Lightning.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from tinytrain.checkpoint.export import export_spec
from tinytrain.checkpoint.formats import is_checkpoint
from tinytrain.cluster.node_memory import node_memory
from tinytrain.cluster.slurm import current_task
from tinytrain.config.dtype import Dtype
from tinytrain.config.schema import PLANNING_MODES, Checkpointing, DataFormat, FinetuneMethod, Mode, Objective, OptimizerName
from tinytrain.data.bos_policy import BosDecision, decide_bos
from tinytrain.data.run_data import RunData, step_keys
from tinytrain.data.tokenizer import earlier_fingerprints, fingerprint
from tinytrain.errors import ConfigError, Problem, raise_if_any
from tinytrain.plan import context as context_plan
from tinytrain.plan import deepspeed_config, finetune, host_memory, memory_margin, micro_batch, resolve, step_peak
from tinytrain.plan import evals as evals_plan
from tinytrain.plan import fp8 as fp8_plan
from tinytrain.plan import optimizer as optimizer_plan
from tinytrain.plan import preference as preference_plan
from tinytrain.plan.activations import LoraShape, layout_of
from tinytrain.plan.attention import VARLEN_KERNELS, AttentionChoice, choose_attention, flash_attn_installed, for_family
from tinytrain.plan.checkpoint_cost import checkpoint_plan, disk_problem
from tinytrain.plan.checkpointing import BY_COST, STEP_FACTOR, ModeCost, every_for
from tinytrain.plan.checkpointing import choose as choose_checkpointing
from tinytrain.plan.families import Family, family, family_of_model_type
from tinytrain.plan.fast_paths import liger_installed, select_fast_paths
from tinytrain.plan.flops import batch_flops
from tinytrain.plan.health import health_plan
from tinytrain.plan.layout import batch_layout, devices_per_node, world_size
from tinytrain.plan.layout_change import run_layout
from tinytrain.plan.levers import checkpointing_mode
from tinytrain.plan.memory import GIB, MemoryPlan, activation_parts, levers_fix, memory_levers, plan_memory, with_levers
from tinytrain.plan.mixture import mixture_plan
from tinytrain.plan.model_shape import ModelShape, parameter_count, shape_from_config, shape_from_hf
from tinytrain.plan.parallel import state_layout, strategy_row
from tinytrain.plan.published import published_note
from tinytrain.plan.run_plan import ClusterLayout, ParallelLayout, RunPlan
from tinytrain.plan.schedule import from_trainer as schedule_from_trainer
from tinytrain.plan.start_points import batch_change_note, finetune_change_problem, init_point, numerics_change_note, rate_change_note, resolve_resume
from tinytrain.plan.step_peak import StepShape
from tinytrain.plan.stragglers import straggler_plan
from tinytrain.plan.torch_varlen import installed_support
from tinytrain.plan.watchdog import watchdog_plan
from tinytrain.preflight import pretrained_tokenizer
from tinytrain.preflight.checks import memory_findings, positions_reached, positions_scaled
from tinytrain.preflight.checks import report as preflight_report
from tinytrain.preflight.checks import run as run_preflight


def make_plan(cfg, tokenizer, run_dir: Path, *, bos: BosDecision | None = None, data: RunData | None = None) -> RunPlan:
    """`cfg` has passed validate(); `run_dir` holds the checkpoints a resume would continue from;
    `bos`: the run's BOS decision (decided here when not given); `data`: the run's data, which
    training reads too (built here only for a mixture, whose table is read from it).

    The stages, in order (each decides its values once; the first error met is the one reported,
    as a run would meet them): the machine and the vocab, the model, the context split and the
    batch, the start points and preflight, the training state (adapters, optimizer, preference),
    the memory fit (micro batch, checkpointing, context), then the plan assembled."""
    bos = bos or decide_bos(cfg, tokenizer)
    data = data or RunData(cfg.data, tokenizer, bos, seed=cfg.seed, progress=False, step_keys=step_keys(cfg.trainer))
    hardware = resolve.effective_hardware(cfg)
    precision = resolve.precision_decision(cfg, hardware)
    vocab = resolve.vocab_plan(cfg, len(tokenizer))
    world = world_size(cfg)
    model = model_stage(cfg, tokenizer, vocab, hardware)
    cp, cp_reason = context_size(cfg, model, world, hardware, precision)
    if cp > 1:
        raise_if_any(context_plan.attention_problems(cp, context_plan.choose_kind(cfg, cp)[0], model.attention.implementation, model.fam.arch.value, softcap=not model.fam.sdpa, cp_reason=cp_reason))
    batch = laid_out_batch(cfg, world, cp, cp_reason)
    layout = run_layout(cfg.parallel.strategy.value, world, batch.data_parallel, cfg.parallel.tp, cfg.parallel.zero_stage, cp)
    resume = resolve_resume(cfg.resume, run_dir / "checkpoints", vocab, model.tokenizer_fingerprint, cfg.model.name, model.shape, layout, model.earlier_fingerprints, parallel=cfg.parallel.name)
    # A resume continues from its own checkpoint: an init_from since pruned or moved (a requeued
    # fine-tune whose base run kept only its newest) is not read, unless its weights are rebuilt
    # (a LoRA base, a DPO reference: init_from_needed below).
    gone = resume is not None and bool(cfg.checkpoint.init_from) and not is_checkpoint(cfg.checkpoint.init_from)
    init_from = None if gone else init_point(cfg.checkpoint.init_from, vocab, model.tokenizer_fingerprint, cfg.checkpoint.allow_tokenizer_change, model.shape, model.earlier_fingerprints)
    profile_window_problem(cfg.trainer, resumed_at=resume.step if resume else 0)
    optimizer_plan.resume_problem(cfg.trainer, resume, layout.dp)
    preflight = run_preflight(cfg, tokenizer, padded_vocab=vocab.padded, fp16=precision.is_fp16, pretrained_config=model.pretrained)
    state = state_stage(cfg, model, tokenizer, vocab, preflight, init_from, precision, world)
    if gone:
        init_from_needed(cfg, resume, state)
    if adapters_changed := finetune_change_problem(resume, state.adapters):
        raise ConfigError(adapters_changed)
    fit = fit_stage(cfg, model, state, batch, world, cp, cp_reason, hardware, precision)
    fit, preflight = memory_check(cfg, fit, preflight, hardware)
    float8 = fp8_plan.decide(cfg, hardware, hidden=model.shape.hidden, strategy_blocker=fit.row.fp8_off, finetune=state.adapters is not None, planning=cfg.mode in PLANNING_MODES, fp32=precision.dtype is Dtype.fp32)
    deepspeed = deepspeed_for(cfg, model, fit, precision, cp, resume)
    fast = fast_paths_for(cfg, model, state, fit, vocab, hardware)
    cluster = cluster_layout(cfg)
    checkpoint = checkpoint_cost(cfg, model.shape, state, fit, world, layout.dp, precision, run_dir)
    host = host_stage(cfg, model, state, fit, hardware, precision, world, cluster.devices_per_node, checkpoint.save_host_bytes)
    if cfg.mode == Mode.train:
        machine_problems(cfg, checkpoint, host, on_gpu=not hardware.is_cpu, sixteen_bit=precision.dtype.value != "fp32")
    return RunPlan(
        model_name=cfg.model.name,
        model_note=published_note(cfg.model, vocab.true, vocab.padded, state.params),
        pretrained_from=cfg.model.pretrained or None,
        shape=model.shape,
        params=state.params,
        attention=model.attention,
        vocab=vocab,
        tokenizer_path=str(cfg.tokenizer.path),
        tokenizer_fingerprint=model.tokenizer_fingerprint,
        pretrained_tokenizer=model.tokenizer_match,
        bos=bos,
        hardware=hardware,
        hardware_source="hardware.gpu" if (cfg.hardware.gpu and cfg.mode in PLANNING_MODES) else "detected",
        precision=precision,
        cluster=cluster,
        parallel=parallel_layout(cfg.parallel, fit.batch, cp, deepspeed is not None and hardware.is_cpu),
        world_size=world,
        batch=fit.batch,
        padded_rows=cfg.data.format is not DataFormat.text,
        max_steps=cfg.trainer.max_steps,
        schedule=schedule_from_trainer(cfg.trainer, fit.batch.ramp),
        stage=cfg.trainer.stage,
        memory=fit.memory,
        context=fit.context,
        fast_paths=fast,
        checkpointing=fit.checkpointing,
        fp8=float8,
        deepspeed=deepspeed,
        preflight=preflight,
        init_from=init_from,
        resume=with_changes(cfg, resume, fit.batch, precision.lightning, float8.enabled),
        mixture=mixture_plan(cfg, fit.batch, data),
        finetune=state.adapters,
        preference=state.preference,
        export=export_spec(cfg, tokenizer, cfg.export.dtype.value, precision.dtype, add_bos=bos.add),
        checkpoint=checkpoint,
        host=host,
        watchdog=watchdog_plan(cfg.cluster, checkpoint.save_seconds),
        stragglers=straggler_plan(cfg.cluster, world),
        health=health_plan(cfg.cluster, world, on_gpu=not hardware.is_cpu),
        profile=profile_line(cfg.trainer, on_gpu=not hardware.is_cpu),
        optimizer=state.optimizer,
        evals=evals_plan.make(cfg, data_parallel=fit.batch.data_parallel),
    )


@dataclass(frozen=True)
class ModelStage:
    """What the model is: its shape and family (a pretrained folder's, or the model group's), its
    attention, and the tokenizer it is trained with."""

    shape: ModelShape
    fam: Family
    attention: AttentionChoice
    pretrained: object | None  # a pretrained folder's transformers config
    tokenizer_match: object | None  # the pretrained folder's own tokenizer against the run's
    tokenizer_fingerprint: str
    logits_tokens: int | None = None  # the most tokens whose logits exist at once (the loss's path); None: all
    earlier_fingerprints: dict[str, str] = field(default_factory=dict)  # older tinytrains' fingerprints of the tokenizer, and what changed


def model_stage(cfg, tokenizer, vocab, hardware) -> ModelStage:
    pretrained = tokenizer_match = None
    if cfg.model.pretrained:
        from tinytrain.checkpoint.pretrained import download_weights, pretrained_config

        if cfg.mode not in PLANNING_MODES:
            download_weights(cfg.model.pretrained)  # a hub id's, into the hub cache, before preflight reads them
        pretrained = pretrained_config(cfg.model.pretrained, cfg.model.trust_remote_code)
        tokenizer_match = pretrained_tokenizer.check(cfg, tokenizer)  # the model's own tokenizer against the run's
        shape = shape_from_hf(pretrained, vocab.padded)
        fam = family_of_model_type(pretrained.model_type, "model.pretrained", cfg.model.pretrained)
    else:
        shape = shape_from_config(cfg.model, vocab.padded)
        fam = family(cfg.model.arch)
    # Gemma-2's attention soft-capping has no SDPA path and no torch varlen one either (fam.sdpa).
    needs = dict(sliding_window=uses_sliding_window(cfg.model, pretrained, fam), softcap=not fam.sdpa)
    attention = for_family(choose_attention(cfg.model.attention, flash_installed=flash_attn_installed(), varlen=installed_support(), hardware=hardware, planning=cfg.mode in PLANNING_MODES, **needs), cfg.model.attention, fam.arch.value, fam.sdpa)
    return ModelStage(shape, fam, attention, pretrained, tokenizer_match, fingerprint(tokenizer), logits_tokens(cfg, fam, vocab, hardware), earlier_fingerprints(tokenizer))


def logits_tokens(cfg, fam, vocab, hardware) -> int | None:
    """How many tokens' logits the loss holds at once, for the activation estimate: liger's fused
    loss none, the chunked loss one chunk, the plain loss (and a preference objective's) all. The
    loss's path does not depend on the checkpointing mode the fit chooses (fast_paths_for)."""
    if cfg.finetune.objective != Objective.sft:
        return None  # preference losses read the policy's logits whole (preference_plan.logits_loss)
    fast = select_fast_paths(cfg.trainer, cfg.parallel.strategy, on_gpu=not hardware.is_cpu, padded_vocab=vocab.padded, liger_available=liger_installed(), zero_stage=cfg.parallel.zero_stage, logits_only=fam.logits_only, seq_len=cfg.data.seq_len)
    if fast.liger_loss:
        return 0
    return fast.loss_chunk_tokens or None


def context_size(cfg, model: ModelStage, world: int, hardware, precision) -> tuple[int, str]:
    """The context-parallel size comes first: the data-parallel size, and so the batch, follow from it."""
    par, shape = cfg.parallel, model.shape
    row = strategy_row(par.strategy)
    full_states = row.model_states(parameter_count(shape), state_layout(par, world, shape.largest_layer_params, buckets=ds_buckets(par, shape, precision), fp32=precision.dtype is Dtype.fp32))
    estimate = activation_estimate(cfg, model, precision, op_off=row.op_checkpoint_off(par.zero_stage))
    step = step_peak.held_everything(row, shape, par.tp)

    def needed_at(seq: int, cp: int) -> float:
        return step_peak.step_peak(full_states, estimate(seq, cp), 0.0, step).total

    def lays_out(cp: int) -> bool:
        return not batch_layout(cfg, world, cp)[1]

    return context_plan.decide_cp(cfg, world, needed_at, gpu_memory_gb=hardware.memory_gb, lays_out=lays_out)


def laid_out_batch(cfg, world: int, cp: int, cp_reason: str):
    """The batch over the cp decided. Validate checked it at a configured cp; at one the plan chose
    (parallel.cp=null) its problems are named here, with the choice."""
    batch, problems = batch_layout(cfg, world, cp)
    if problems:
        raise ConfigError([replace(p, message=f"{p.message} ({cp_reason})") if cp_reason else p for p in problems])
    return batch


@dataclass(frozen=True)
class StateStage:
    """What training holds besides activations: parameters, LoRA adapters, the optimizer's state,
    a preference objective's reference, and their memory per GPU."""

    params: int
    adapters: object | None  # finetune.FinetunePlan
    optimizer: object  # optimizer.OptimizerPlan
    preference: object | None  # preference.PreferencePlan
    states: object  # memory.ModelStates per GPU


def init_from_needed(cfg, resume, state) -> None:
    """A resumed run rebuilds a LoRA run's frozen base and a DPO/IPO reference from
    checkpoint.init_from (train/fit.py build_module), and finds precomputed reference log-probs by
    its identity: those need the file still."""
    pref = state.preference
    if state.adapters:
        rebuilt = "the frozen base of its adapters built from it"
    elif pref is not None and pref.frozen_copy:
        rebuilt = "its frozen reference model built from it"
    elif pref is not None and pref.precomputed:
        rebuilt = "its cached reference log-probs found by that file's identity"
    else:
        return
    raise ConfigError(
        Problem(
            "checkpoint.init_from",
            cfg.checkpoint.init_from,
            f"no such checkpoint file, and the run resumes from step {resume.step} with {rebuilt}",
            "restore that checkpoint where it was (the weights the run started from), or point checkpoint.init_from at a copy of it",
        )
    )


def state_stage(cfg, model: ModelStage, tokenizer, vocab, preflight, init_from, precision, world: int) -> StateStage:
    shape = model.shape
    params = parameter_count(shape)
    base_rows = model.pretrained.vocab_size if model.pretrained is not None else init_from.saved["true_vocab"] if init_from else vocab.true
    adapters = finetune.make(cfg, shape, tokenizer, base_rows=base_rows, rows_to_fix=preflight.rows_to_fix, compute=precision.dtype, fam=model.fam)
    optimizer = optimizer_plan.make(cfg.trainer, shape, adapters.trainable_params if adapters else params, fp32=precision.dtype is Dtype.fp32)
    states = states_on(cfg, shape, params, adapters, optimizer, precision, world)
    preference = preference_plan.make(cfg, params, world, fp32=precision.dtype is Dtype.fp32)
    if adapters:
        preference_plan.trainable_rows_problem(preference, adapters)
    return StateStage(params, adapters, optimizer, preference, states)


def states_on(cfg, shape, params: int, adapters, optimizer, precision, world: int):
    """The model states per GPU (weights, gradients, optimizer state) on `world` GPUs: the run's, or
    a larger world's that a fix names (ZeRO and FSDP partition them over more ranks)."""
    par = cfg.parallel
    row = strategy_row(par.strategy)
    layout = state_layout(par, world, shape.largest_layer_params, buckets=ds_buckets(par, shape, precision), fp32=precision.dtype is Dtype.fp32)
    if adapters:
        states = finetune.adapter_state_memory(adapters, shape, params, strategy=par.strategy, layout=layout)
    else:
        states = row.model_states(params, layout)
    return optimizer_plan.states(states, optimizer, layout, partitioned=row.deepspeed or row.tensor_parallel)


@dataclass(frozen=True)
class FitStage:
    """How the run fits the GPU: the micro batch (chosen under trainer.micro_batch_size=auto), the
    activation checkpointing mode and the table it was chosen from, memory, and the context plan."""

    row: object  # the strategy's row (plan/parallel.py)
    batch: object  # layout.BatchPlan, laid out again for a micro batch chosen here
    checkpointing: object  # checkpointing.CheckpointingPlan
    memory: object  # memory.MemoryPlan
    context: object  # context.ContextPlan
    base_step: float | None  # seconds per step at the assumed MFU (None without a GPU peak)


def fit_stage(cfg, model: ModelStage, state: StateStage, batch, world: int, cp: int, cp_reason: str, hardware, precision) -> FitStage:
    par = cfg.parallel
    row = strategy_row(par.strategy)
    requested = checkpointing_mode(cfg.trainer.activation_checkpointing)
    op_off = row.op_checkpoint_off(par.zero_stage)
    reference_bytes = state.preference.reference_bytes if state.preference else 0.0
    base_step = step_seconds(hardware=hardware, precision=precision, shape=model.shape, batch=batch, world=world, work=state.preference.step_work if state.preference else 1.0)

    def rows_of(micro: int) -> int:
        return micro * (2 if state.preference else 1)  # a preference micro batch holds each pair's chosen and rejected rows

    def step_for(micro: int) -> StepShape:
        return step_peak.step_shape(
            row,
            accumulation=batch.global_batch_size // (micro * batch.data_parallel),
            shape=model.shape,
            optimizer=state.optimizer,
            trainable=state.adapters.trainable_params if state.adapters else state.params,
            tp=par.tp,
            world=world,
            on_gpu=not hardware.is_cpu,
            zero_stage=par.zero_stage,
            offload_optimizer=par.offload_optimizer,
        )

    def parts_for(mode: Checkpointing, seq: int, cp: int, micro: int):
        return activation_formula(model, par, precision, op_off, mode, seq=seq, cp=cp, rows=rows_of(micro), lora=lora_shape(cfg), ring=context_plan.is_ring(cfg, cp))

    def memory_for(mode: Checkpointing, seq: int, cp: int, micro: int) -> MemoryPlan:
        parts = parts_for(mode, seq, cp, micro)
        memory = plan_memory(state.states, with_margin(parts.peak, par, precision, mode), hardware.memory_gb, reference_bytes, step=step_for(micro), recompute=parts.recompute)
        return replace(memory, activation_parts=parts.to_gib())

    fixed_micro = micro_batch.configured(cfg.trainer.micro_batch_size)
    micros = [batch.micro_batch_size] if fixed_micro is not None else auto_candidates(cfg, batch)
    table = [mode_cost(mode, memory_for(mode, batch.seq_len, cp, m), m, base_step) for m in micros for mode in BY_COST]
    if fixed_micro is None:
        # micro_batch problems refused auto without a GPU memory; the batch is laid out again for the micro batch chosen
        modes = [m.value for m in (BY_COST if requested is Checkpointing.auto else (requested,))]
        micro, mode, why = micro_batch.choose(table, modes, hardware.memory_gb * 1e9 / GIB)
        batch, problems = batch_layout(cfg, world, cp, micro=micro)
        if problems:  # a batch warm-up, laid out at the micro batch chosen (its unit is dp x accumulation)
            raise ConfigError([replace(p, message=f"{p.message} (at micro batch {micro}, which trainer.micro_batch_size=auto chose: {why.removeprefix('auto: ')})", fix=f"{p.fix}; or set trainer.micro_batch_size to a number") for p in problems])
        ckpt = choose_checkpointing(Checkpointing(mode), table, op_off, requested=requested, reason=why)
    else:
        ckpt = choose_checkpointing(requested, table, op_off, gpu_memory_gib=hardware.memory_gb * 1e9 / GIB if hardware.memory_gb else None)

    def memory_at(seq: int, cp: int) -> MemoryPlan:
        return memory_for(Checkpointing(ckpt.mode), seq, cp, batch.micro_batch_size)

    measured = memory_margin.measured(par.strategy.value, precision.lightning, ckpt.mode)
    memory = replace(memory_at(batch.seq_len, cp), margin=measured.to_dict() if measured else None)
    preference_plan.memory_problem(state.preference, memory)

    states_by_world = {world: state.states}

    def needed_at(seq: int, cp: int, gpus: int | None = None) -> float:
        """Bytes per GPU at `seq` and `cp`, unrounded (the memory plan's GiB are to 1 MiB), on `gpus`
        GPUs (by default this run's, or the fewest that hold tp x cp where that is more)."""
        gpus = gpus or max(world, par.tp * cp)
        if gpus not in states_by_world:
            states_by_world[gpus] = states_on(cfg, model.shape, state.params, state.adapters, state.optimizer, precision, gpus)
        mode, micro = Checkpointing(ckpt.mode), batch.micro_batch_size
        parts = parts_for(mode, seq, cp, micro)
        return step_peak.step_peak(states_by_world[gpus], with_margin(parts.peak, par, precision, mode), parts.recompute, step_for(micro), reference_bytes).total

    positions = positions_reached(cfg, model.pretrained)
    context = context_plan.with_longest(cfg, context_plan.choose(cfg, cp, cp_reason), needed_at, gpu_memory_gb=hardware.memory_gb, world=world, positions=positions, scaled=positions_scaled(cfg, model.pretrained))
    states_levers = run_levers(cfg, row, batch.micro_batch_size, checkpointing=ckpt.mode, states_only=True, more_gpus=False)
    context_plan.fit_problem(cfg, context, memory, needed_at, world=world, checkpointing=ckpt.mode, states_levers=states_levers)
    return FitStage(row, batch, ckpt, memory, context, base_step)


def run_levers(cfg, row, micro_batch: int, *, checkpointing: str, states_only: bool = False, more_gpus: bool = True) -> list[str]:
    """memory_levers for this run: its strategy, fine-tuning method and heads."""
    m = cfg.model
    return memory_levers(cfg.parallel, deepspeed=row.deepspeed, tensor_parallel=row.tensor_parallel, checkpointing=checkpointing, micro_batch=micro_batch, qlora=cfg.finetune.method == FinetuneMethod.qlora, heads=(m.num_heads, m.num_kv_heads), states_only=states_only, more_gpus=more_gpus)


def memory_check(cfg, fit: FitStage, preflight, hardware):
    """(fit, preflight) with a memory line that does not fit naming the levers the run has left,
    and the preflight check `memory` refusing it (or warning, as preflight.memory says)."""
    # Where the model states alone fill the GPU, only the levers that lower them are named.
    states = fit.memory.states_overflow
    levers = run_levers(cfg, fit.row, fit.batch.micro_batch_size, checkpointing=fit.checkpointing.mode, states_only=states)
    fit = replace(fit, memory=with_levers(fit.memory, levers))
    findings = preflight_report(memory_findings(cfg, fit.memory, hardware.name, levers_fix(levers, states=states)))
    return fit, replace(preflight, findings=preflight.findings + findings)


def host_stage(cfg, model: ModelStage, state: StateStage, fit: FitStage, hardware, precision, world: int, ranks_per_node: int, save_host_bytes: int):
    """Host memory per node (plan/host_memory.py); mode=train refuses what cannot fit the node it runs on (machine_problems)."""
    par, deepspeed = cfg.parallel, fit.row.deepspeed
    on_this_machine = cfg.mode == Mode.train or (cfg.mode == Mode.plan and not cfg.hardware.gpu)
    return host_memory.plan_host(
        memory=fit.memory,
        params=state.params,
        trainable=state.adapters.trainable_params if state.adapters else state.params,
        world=world,
        ranks_per_node=ranks_per_node,
        on_gpu=not hardware.is_cpu,
        pretrained=model.pretrained,
        qlora=bool(state.adapters and state.adapters.method == "qlora"),
        frozen_copy=bool(state.preference and state.preference.frozen_copy),
        offload_optimizer=deepspeed and par.offload_optimizer,
        offload_params=deepspeed and par.offload_params,
        save_host_bytes=save_host_bytes,
        node=node_memory() if on_this_machine else (None, host_memory.ELSEWHERE),
    )


def machine_problems(cfg, checkpoint, host, *, on_gpu: bool, sixteen_bit: bool) -> None:
    """mode=train refuses what the machine it runs on cannot hold: its disk (keep_last + 1
    checkpoints at run.root) and its node's memory, both at once, so a run short of both is not
    fixed one at a time."""
    disk = disk_problem(cfg, step=checkpoint.step_bytes, needed=checkpoint.disk_needed_bytes, free=checkpoint.free_bytes, sixteen_bit=sixteen_bit, end=checkpoint.end_bytes)
    memory = host_memory.host_problem(host, on_gpu=on_gpu, model_name=cfg.model.name, parallel_name=cfg.parallel.name)
    if problems := [p for p in (memory, disk) if p is not None]:
        raise ConfigError(problems)


def ds_buckets(par, shape, precision) -> float:
    """Bytes of ZeRO's reduce buckets per GPU under a DeepSpeed strategy (plan/deepspeed_config.py),
    in the training dtype (DeepSpeed's gradient accumulation dtype, which tinytrain leaves at it)."""
    if not strategy_row(par.strategy).deepspeed:
        return 0.0
    element = layout_of(precision.dtype, deepspeed=True).activation_bytes  # 16-bit, or fp32 under 32-true
    return deepspeed_config.bucket_bytes(par.zero_stage, deepspeed_config.reduce_bucket(par, shape.hidden), element)


def auto_candidates(cfg, batch) -> list[int]:
    """The micro batches trainer.micro_batch_size=auto chooses from; refused when there is none."""
    smallest = preference_plan.smallest_micro_batch(cfg)
    found = micro_batch.candidates(batch.global_batch_size, batch.data_parallel, smallest)
    if not found:
        per_rank = batch.global_batch_size // batch.data_parallel
        raise ConfigError(Problem("trainer.global_batch_size", batch.global_batch_size, f"gives {per_rank} sequence(s) per data-parallel rank ({batch.data_parallel}), and {cfg.finetune.objective.value} needs micro batches of {smallest} or more", f"use trainer.global_batch_size={smallest * batch.data_parallel} or more"))
    return found


def same_stage_rate_change(cfg, resume, batch) -> str | None:
    """A new stage starts its own schedule (its line says so); within one, another schedule moves the rate."""
    if resume.stage != cfg.trainer.stage:
        return None
    return rate_change_note(resume, schedule_from_trainer(cfg.trainer, batch.ramp), cfg.trainer.lr)


def with_changes(cfg, resume, batch, precision: str, fp8: bool):
    """The resume point, with what this run's other micro batch, accumulation, precision or fp8
    does to it."""
    if resume is None:
        return None
    grouped = cfg.data.format is not DataFormat.text and cfg.data.group_by_length and not cfg.data.sources
    return replace(resume, batch_change=batch_change_note(resume, batch.micro_batch_size, batch.accumulate_grad_batches, grouped, batch.data_parallel), numerics_change=numerics_change_note(resume, precision, fp8), rate_change=same_stage_rate_change(cfg, resume, batch))


def deepspeed_for(cfg, model: ModelStage, fit: FitStage, precision, cp: int, resume) -> dict | None:
    """The generated DeepSpeed config (a zero* strategy), resumed through a universal copy when the layout changed."""
    if not fit.row.deepspeed:
        return None
    deepspeed = deepspeed_config.build(cfg.parallel, fit.batch, precision, cfg.trainer.grad_clip, cp, muon=cfg.trainer.optimizer is OptimizerName.muon, hidden=model.shape.hidden)
    return deepspeed_config.load_universal(deepspeed) if resume is not None and resume.universal else deepspeed


def fast_paths_for(cfg, model: ModelStage, state: StateStage, fit: FitStage, vocab, hardware):
    fast = select_fast_paths(cfg.trainer, cfg.parallel.strategy, on_gpu=not hardware.is_cpu, padded_vocab=vocab.padded, liger_available=liger_installed(), zero_stage=cfg.parallel.zero_stage, logits_only=model.fam.logits_only, checkpointing=fit.checkpointing, seq_len=cfg.data.seq_len, planning=cfg.mode in PLANNING_MODES)
    return preference_plan.logits_loss(fast) if state.preference else fast


def parallel_layout(par, batch, cp: int, deepspeed_on_this_cpu: bool) -> ParallelLayout:
    return ParallelLayout(
        strategy=par.strategy,
        name=par.name,
        tp=par.tp,
        dp=batch.data_parallel,
        cp=cp,
        zero_stage=par.zero_stage,
        offload_optimizer=par.offload_optimizer,
        deepspeed_on_cpu=deepspeed_on_this_cpu and par.deepspeed_on_cpu,
    )


def checkpoint_cost(cfg, shape, state: StateStage, fit: FitStage, world: int, partitions: int, precision, run_dir: Path):
    """`partitions`: the run layout's dp, DeepSpeed's optimizer partitions (dp x cp under it)."""
    return checkpoint_plan(
        cfg,
        params=state.params,
        adapter_params=state.adapters.adapter_params if state.adapters else 0,
        trainable=state.adapters.trainable_params if state.adapters else state.params,
        largest_tensor=4 * max(shape.vocab * shape.hidden, shape.intermediate * shape.hidden),
        world=world,
        partitions=partitions,
        sixteen_bit=precision.dtype.value != "fp32",
        step_seconds=fit.base_step,
        run_dir=run_dir,
        muon_params=state.optimizer.muon_params,
    )


def activation_estimate(cfg, model: ModelStage, precision, *, op_off):
    """Activation bytes per GPU as a function of (seq_len, cp) for sizing cp (parallel.cp=null) before
    the batch is laid out: the configured micro batch (1 for auto) and checkpointing mode (auto:
    full, the most it could save; plan/memory.py), with the same every-k-block fallback (`op_off`)
    as the memory line of the plan, so the cp chosen is sized by the estimate the plan prints."""
    # A preference micro batch holds each pair's chosen and rejected rows.
    rows = (micro_batch.configured(cfg.trainer.micro_batch_size) or 1) * (1 if cfg.finetune.objective == Objective.sft else 2)
    mode = checkpointing_mode(cfg.trainer.activation_checkpointing)
    mode = Checkpointing.full if mode is Checkpointing.auto else mode

    def at(seq: int, cp: int) -> float:
        return block_activations(model, cfg.parallel, precision, op_off, mode, seq=seq, cp=cp, rows=rows, lora=lora_shape(cfg), ring=context_plan.is_ring(cfg, cp))

    return at


def lora_shape(cfg) -> LoraShape | None:
    """What the activation count needs of finetune=lora|qlora's adapters (None for full fine-tuning)."""
    f = cfg.finetune
    return None if f.method is FinetuneMethod.full else LoraShape(rank=f.rank, dropout=f.dropout > 0)


def block_activations(model: ModelStage, par, precision, op_off, mode: Checkpointing, *, seq: int, cp: int, rows: int, lora: LoraShape | None = None, ring: bool = False) -> float:
    """Activation bytes per GPU for `rows` sequences of `seq` tokens split over `cp` ranks under a
    checkpointing mode (with its every-k-block fallback), for the model's family, attention kernel
    and loss, counted at what a GPU run measured where one measured more for this layout and mode
    (plan/memory_margin.py): what both the cp sizing and the plan's memory line estimate, so they agree.
    `lora`: finetune=lora's adapters (plan/activations.py lora_layer_bytes); `ring`: cp's kind is ring."""
    return with_margin(activation_formula(model, par, precision, op_off, mode, seq=seq, cp=cp, rows=rows, lora=lora, ring=ring).peak, par, precision, mode)


def with_margin(activations: float, par, precision, mode: Checkpointing) -> float:
    """The activation count at what a GPU run measured, where one measured more (plan/memory_margin.py)."""
    measured = memory_margin.measured(par.strategy.value, precision.lightning, mode)
    return activations * (measured.factor if measured else 1.0)


def activation_formula(model: ModelStage, par, precision, op_off, mode: Checkpointing, *, seq: int, cp: int, rows: int, lora: LoraShape | None = None, ring: bool = False):
    """block_activations' count before any measured margin, in its parts (plan/memory.py ActivationParts)."""
    layout = layout_of(precision.dtype, strategy_row(par.strategy).deepspeed)
    kernel = model.attention.implementation
    return activation_parts(
        shape=model.shape,
        layout=layout,
        seq=seq,
        micro_batch=rows,
        tp=par.tp,
        flash=kernel in VARLEN_KERNELS,  # no seq^2 masks or scores held
        eager=kernel == "eager",
        cp=cp,
        ring=ring,
        checkpointing=mode,
        every=every_for(mode, op_off),
        logits_tokens=model.logits_tokens,
        lora=lora,
    )


def uses_sliding_window(model_cfg, pretrained, fam) -> bool:
    """Whether any layer attends through a sliding window (what a varlen kernel must offer)."""
    if pretrained is not None:
        kinds = getattr(pretrained, "layer_types", None)  # Gemma-2/3 without a window: every layer full, a window none reads
        if kinds is not None and "sliding_attention" not in kinds:
            return False
        return getattr(pretrained, "sliding_window", None) is not None  # Qwen2 sets it None unless use_sliding_window
    return fam.sliding_window and model_cfg.sliding_window is not None


def step_seconds(*, hardware, precision, shape: ModelShape, batch, world: int, work: float = 1.0) -> float | None:
    """An optimizer step's time at ASSUMED_MFU of the hardware table's dense peak (None without one),
    its FLOPs counted as MFU counts them (plan/flops.py), attention over whole rows: the most a
    packed row's documents cost, and at long context most of the step (Llama-3-8B at 128k tokens:
    4.9x the dense matmuls). `work`: sequences' training compute per batch row (a preference
    objective's rows and reference forwards: PreferencePlan.step_work)."""
    from tinytrain.plan.checkpoint_cost import ASSUMED_MFU

    peak = {"bf16": hardware.peak_bf16_tflops, "fp16": hardware.peak_fp16_tflops}.get(precision.dtype.value)
    if hardware.is_cpu or not peak:
        return None
    tokens = batch.tokens_per_step
    return work * batch_flops(shape, tokens, tokens * batch.seq_len) / (world * peak * 1e12 * ASSUMED_MFU)


def mode_cost(mode: Checkpointing, memory, micro_batch: int, base_step: float | None) -> ModeCost:
    return ModeCost(micro_batch, mode.value, memory.activations_gib, memory.total_gib, memory.fits, None if base_step is None else base_step * STEP_FACTOR[mode])


def cluster_layout(cfg) -> ClusterLayout:
    task = current_task()
    if cfg.cluster.name == "slurm":
        source = f"allocation of Slurm job {task.job_id}" if task else "cluster.nodes x cluster.devices (no Slurm job here)"
    else:
        source = f"cluster={cfg.cluster.name}"
    return ClusterLayout(cfg.cluster.name, cfg.cluster.nodes, devices_per_node(cfg), source)


def profile_window_problem(t, *, resumed_at: int) -> None:
    """trainer.profile on a resumed run: its window of this process's steps within the
    trainer.max_steps less `resumed_at` left (validate checked it against a fresh run's)."""
    last = t.profile_start + t.profile_steps - 1
    left = t.max_steps - resumed_at
    if t.profile and resumed_at and last >= left:
        raise ConfigError(Problem("trainer.profile_start", t.profile_start, f"the profiled steps {t.profile_start}-{last} of this process end beyond the {left} steps left (resuming at step {resumed_at} of trainer.max_steps={t.max_steps})", f"use trainer.profile_start <= {max(0, left - t.profile_steps)} (or fewer trainer.profile_steps)"))


def profile_line(t, *, on_gpu: bool) -> str | None:
    """trainer.profile: the steps traced (this process's, after a warm-up step) and what is written."""
    if not t.profile:
        return None
    last = t.profile_start + t.profile_steps - 1
    warmup = f", after a warm-up step ({t.profile_start - 1})" if t.profile_start > 0 else ""
    oom = "; on a CUDA out-of-memory error, the allocator's snapshot beside the plan's estimate" if on_gpu else ""
    return f"steps {t.profile_start}-{last} of this process traced{warmup} -> <run>/profile/: a torch profiler trace per rank and the top costs{oom}; the throughput summary leaves them out"

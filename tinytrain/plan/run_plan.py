"""The run plan: every value tinytrain derives for a run, decided once by the planning stage.

`RunPlan` is frozen and typed; the build and fit stage takes it as it is. Everything people and
tools see of a run's decisions is a view of it: `to_dict()` is plan.json (field reference:
docs/plan-json.md), `render()` the printed plan, `resolved_config()` config_resolved.yaml
and wandb's config. Built without allocating weights, so a login node can plan a 32-GPU run.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from omegaconf import DictConfig, OmegaConf

from tinytrain.checkpoint.export import ExportSpec
from tinytrain.config.schema import Strategy
from tinytrain.data.bos_policy import BosDecision
from tinytrain.plan.attention import AttentionChoice
from tinytrain.plan.checkpoint_cost import CheckpointPlan
from tinytrain.plan.checkpoint_cost import render as render_checkpoint
from tinytrain.plan.checkpointing import CheckpointingPlan
from tinytrain.plan.checkpointing import render as render_checkpointing
from tinytrain.plan.context import ContextPlan
from tinytrain.plan.context import render as render_context
from tinytrain.plan.evals import EvalPlan
from tinytrain.plan.evals import render as render_evals
from tinytrain.plan.fast_paths import FastPaths
from tinytrain.plan.finetune import FinetunePlan
from tinytrain.plan.fp8 import Fp8Plan
from tinytrain.plan.hardware import Hardware
from tinytrain.plan.health import HealthPlan
from tinytrain.plan.host_memory import HostMemoryPlan
from tinytrain.plan.host_memory import render as render_host
from tinytrain.plan.layout import BatchPlan
from tinytrain.plan.layout_change import run_layout
from tinytrain.plan.memory import MemoryPlan, render_activation_parts
from tinytrain.plan.memory_margin import render as render_margin
from tinytrain.plan.mixture import MixturePlan
from tinytrain.plan.mixture import render as render_mixture
from tinytrain.plan.model_shape import ModelShape
from tinytrain.plan.optimizer import OptimizerPlan
from tinytrain.plan.optimizer import line as optimizer_line
from tinytrain.plan.parallel import StrategyRow, strategy_row
from tinytrain.plan.precision import PrecisionDecision
from tinytrain.plan.preference import PreferencePlan
from tinytrain.plan.schedule import Schedule
from tinytrain.plan.schedule import picture as schedule_picture
from tinytrain.plan.start_points import InitPoint, ResumePoint, checkpoint_metadata
from tinytrain.plan.step_peak import render_sum
from tinytrain.plan.stragglers import StragglerPlan
from tinytrain.plan.vocab import VocabPlan
from tinytrain.plan.watchdog import WatchdogPlan
from tinytrain.preflight.checks import PreflightReport
from tinytrain.preflight.pretrained_tokenizer import TokenizerMatch

# Under parallel.cp's ring the model's attention is replaced (model/ring_attention.py).
RING_ATTENTION = "           under ring (parallel.cp), every layer attends through torch's context parallel instead: compiled flex attention on GPUs, SDPA over its block mask on a CPU"


@dataclass(frozen=True)
class ClusterLayout:
    name: str
    nodes: int
    devices_per_node: int
    source: str  # where nodes x devices came from


@dataclass(frozen=True)
class ParallelLayout:
    strategy: Strategy
    name: str  # the parallel group chosen (zero2, fsdp_tp, ...)
    tp: int
    dp: int
    zero_stage: int
    offload_optimizer: bool
    deepspeed_on_cpu: bool  # DeepSpeed on its CPU accelerator (tests only)
    cp: int = 1  # context parallelism: the ranks each sequence is split over (plan/context.py)

    @property
    def row(self) -> StrategyRow:
        """What the strategy allows and how it behaves (plan/parallel.py's table)."""
        return strategy_row(self.strategy)


@dataclass(frozen=True)
class RunPlan:
    model_name: str
    shape: ModelShape
    params: int
    attention: AttentionChoice
    vocab: VocabPlan
    tokenizer_path: str
    tokenizer_fingerprint: str
    bos: BosDecision  # a BOS token before every document and SFT sample, and why
    hardware: Hardware
    hardware_source: str  # "hardware.gpu" (a plan for another machine) or "detected"
    precision: PrecisionDecision
    cluster: ClusterLayout
    parallel: ParallelLayout
    world_size: int
    batch: BatchPlan
    max_steps: int
    memory: MemoryPlan
    context: ContextPlan
    fast_paths: FastPaths
    deepspeed: dict | None  # the generated config, overrides applied (deepspeed_config.json)
    preflight: PreflightReport
    init_from: InitPoint | None
    resume: ResumePoint | None
    schedule: Schedule | None = None  # the learning-rate schedule (tinytrain/plan/schedule.py)
    stage: str = "main"  # trainer.stage
    mixture: MixturePlan | None = None  # data.sources: each source's share, size and passes
    finetune: FinetunePlan | None = None  # finetune=lora|qlora: adapters, trainable rows, frozen base dtype
    preference: PreferencePlan | None = None  # finetune.objective=dpo|ipo|simpo: settings and the reference
    checkpoint: CheckpointPlan = CheckpointPlan("file", False, 3)  # format, async saves, keep_last, their size, memory, disk, time
    export: ExportSpec = ExportSpec()  # what the end-of-run export and training's samples serve: template, stops, BOS, dtype
    pretrained_tokenizer: TokenizerMatch | None = None  # model.pretrained's own tokenizer against the run's
    optimizer: OptimizerPlan | None = None  # trainer.optimizer: which parameters Muon takes, the state it holds
    checkpointing: CheckpointingPlan | None = None  # activation checkpointing: each mode's memory and step time, the one chosen
    fp8: Fp8Plan = Fp8Plan(False, False, "off (precision.fp8=false)")  # float8 linear layers through torchao
    model_note: str | None = None  # a preset of a published model's shape trained with another tokenizer (plan/published.py)
    pretrained_from: str | None = None  # model.pretrained: the folder (or hub id) whose shape and weights these are
    evals: EvalPlan | None = None  # eval.tasks: downstream tasks scored while training (plan/evals.py)
    watchdog: WatchdogPlan | None = None  # the hang watchdog's limits per phase and the collective timeout (plan/watchdog.py)
    health: HealthPlan | None = None  # the health check before training, and what a bad node does (plan/health.py)
    stragglers: StragglerPlan | None = None  # how often ranks' forward times are compared, and the threshold (plan/stragglers.py)
    host: HostMemoryPlan | None = None  # host memory per node: the build, offloaded states, a CPU run's whole state (plan/host_memory.py)
    profile: str | None = None  # trainer.profile: the steps traced and where the trace goes (planner.profile_line)
    padded_rows: bool = False  # instruction or preference data: rows padded to their batch's longest, counted at seq_len

    @property
    def on_gpu(self) -> bool:
        return not self.hardware.is_cpu

    @property
    def total_tokens(self) -> int:
        return self.batch.tokens_over(self.max_steps)

    @property
    def stage_start(self) -> int:
        """The first step this stage trains: 0, or the step of the checkpoint it continues."""
        return self.resume.step if self.resume else 0

    def checkpoint_metadata(self) -> dict:
        """What every checkpoint of the run carries, so a resume or init_from can be checked."""
        meta = checkpoint_metadata(self.vocab, self.tokenizer_fingerprint, self.model_name, self.stage)
        p = self.parallel
        # The layout it was saved under: a resume under another one is decided from it (plan/layout_change.py).
        meta["layout"] = run_layout(p.strategy.value, self.world_size, p.dp, p.tp, p.zero_stage, p.cp).to_dict()
        # The numerics it trained in: a resume under others is said in the plan (start_points.py).
        meta["numerics"] = {"precision": self.precision.lightning, "fp8": bool(self.fp8 and self.fp8.enabled)}
        meta["batch"] = {"data_parallel": self.batch.data_parallel}  # a resume under another one says its global batch
        if self.finetune:  # what an export needs to merge the adapters and write peft's folder
            meta["finetune"] = self.finetune.to_dict()
        return meta

    def to_dict(self) -> dict:
        hw, b, v = self.hardware, self.batch, self.vocab
        return {
            "model": {"name": self.model_name, "pretrained": self.pretrained_from, "attention": self.attention.implementation, "attention_reason": self.attention.reason, "note": self.model_note},
            "vocab": {"true": v.true, "padded": v.padded, "multiple": v.multiple, "tp": v.tp, "padding_rows": v.padding_rows},
            "tokenizer": {
                "path": self.tokenizer_path,
                "fingerprint": self.tokenizer_fingerprint,
                "add_bos": self.bos.add,
                "add_bos_reason": self.bos.reason,
                "pretrained": self.pretrained_tokenizer and self.pretrained_tokenizer.to_dict(),
            },
            "precision": self.precision.to_dict(),
            "hardware": {
                "gpu": None if hw.is_cpu else hw.name,
                "compute_capability": None if hw.is_cpu else ".".join(map(str, hw.compute_capability)),
                "memory_gb": hw.memory_gb,
                "source": self.hardware_source,
            },
            "params": {"total": self.params},
            "cluster": asdict(self.cluster),
            "parallel": {"strategy": self.parallel.strategy.value, "tp": self.parallel.tp, "dp": self.parallel.dp, "cp": self.parallel.cp, "deepspeed_on_cpu": self.parallel.deepspeed_on_cpu},
            "context": self.context.to_dict(),
            "world_size": self.world_size,
            "batch": {"micro_batch_size": b.micro_batch_size, "accumulate_grad_batches": b.accumulate_grad_batches, "global_batch_size": b.global_batch_size, "seq_len": b.seq_len},
            "tokens_per_step": b.tokens_per_step,
            "tokens_padded": self.padded_rows,
            "batch_size_warmup": b.ramp and b.ramp.to_dict(self.max_steps),
            "max_steps": self.max_steps,
            "schedule": self.schedule and {**self.schedule.to_dict(), "stage": self.stage, "stage_start": self.stage_start, "stage_start_at": round(self.schedule.position(self.stage_start), 3)},
            "total_tokens": self.total_tokens,
            "memory_per_gpu": self.memory.to_dict(),
            "host_memory": self.host and self.host.to_dict(),
            "deepspeed": self.deepspeed,
            "fast_paths": self.fast_paths.to_dict(),
            "preflight": self.preflight.to_dict(),
            "init_from": self.init_from and self.init_from.to_dict(),
            "resume": self.resume and self.resume.to_dict(),
            "data_mixture": self.mixture and self.mixture.to_dict(),
            "finetune": self.finetune and self.finetune.to_dict(),
            "preference": self.preference and self.preference.to_dict(),
            "checkpoint": self.checkpoint.to_dict(),
            "optimizer": self.optimizer and self.optimizer.to_dict(),
            "activation_checkpointing": self.checkpointing and self.checkpointing.to_dict(),
            "fp8": self.fp8.to_dict(),
            "evals": self.evals and self.evals.to_dict(),
            "watchdog": self.watchdog and self.watchdog.to_dict(),
            "stragglers": self.stragglers and self.stragglers.to_dict(),
            "health": self.health and self.health.to_dict(),
            "profile": self.profile,
        }

    def resolved_config(self, cfg: DictConfig) -> dict:
        """The composed config with the plan's derived values filled in (config_resolved.yaml,
        wandb's config): what a rerun with these settings would decide again."""
        resolved = OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
        resolved["model"]["vocab_size"] = self.vocab.padded
        resolved["precision"]["value"] = self.precision.lightning
        resolved["tokenizer"]["add_bos"] = resolved["data"]["prepend_bos"] = self.bos.add  # what the data and the export follow
        resolved["trainer"]["activation_checkpointing"] = self.fast_paths.activation_checkpointing  # auto and the old booleans, resolved
        resolved["trainer"]["compile"] = self.fast_paths.compile
        # micro_batch_size=auto: what it chose, and the accumulation that keeps the global batch.
        resolved["trainer"]["micro_batch_size"] = self.batch.micro_batch_size
        resolved["trainer"]["accumulate_grad_batches"] = self.batch.accumulate_grad_batches
        resolved["precision"]["fp8"] = bool(self.fp8 and self.fp8.enabled)  # auto, decided
        return resolved

    def render(self) -> str:
        return render(self.to_dict())


def _human(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)


def render_schedule(s: dict, total: int, resume: dict | None) -> list[str]:
    phases = ", ".join(f"{p['phase']} {p['from_step']}-{p['to_step']}" for p in s["phases"])
    lines = [f"schedule   {s['kind']}: {phases} (to {s['min_lr_ratio']:g} x lr); stage {s['stage']!r}"]
    marks = {}
    if resume:
        came = f"stage {resume['stage']!r}" if resume["stage"] != s["stage"] else "the same stage"
        lines.append(f"stage      {s['stage']!r} from step {s['stage_start']} ({came}'s checkpoint): this schedule from there on, the optimizer state carried over")
        if s["decay_steps"] and s["decay_start"] < s["stage_start_at"] and resume["stage"] != s["stage"]:
            lines.append(f"           note: the decay starts at step {s['decay_start']}, before this stage's first step: the rate jumps to the schedule's value at step {s['stage_start']}")
        marks[s["stage_start_at"]] = "|"
    lines += ["           " + line for line in schedule_picture(s, total, marks=marks)]
    return lines


def render(plan: dict) -> str:
    """The printed plan, from plan.json's fields (so what is printed is what is written)."""
    return "\n".join(model_lines(plan) + layout_lines(plan) + training_lines(plan) + fit_lines(plan) + start_lines(plan))


def model_title(model: dict) -> str:
    """The preset's name, or the pretrained folder whose shape the run takes (the composed preset,
    model=tiny unless named, only carries the settings the folder leaves open)."""
    return f"model.pretrained={model['pretrained']} (its config's shape)" if model.get("pretrained") else model["name"]


def model_lines(plan: dict) -> list[str]:
    """The model, its tokenizer and vocab, the hardware and precision."""
    v, p, hw = plan["vocab"], plan["precision"], plan["hardware"]
    where = hw["gpu"] or "cpu"
    if hw["compute_capability"]:
        where += f" (compute capability {hw['compute_capability']}, {hw['memory_gb']} GB, from {hw['source']})"
    lines = [
        f"model      {model_title(plan['model'])}: {_human(plan['params']['total'])} parameters ({plan['params']['total']:,})",
        *([f"           note: {plan['model']['note']}"] if plan["model"].get("note") else []),
        f"attention  {plan['model']['attention']}: {plan['model']['attention_reason']}",
        *([RING_ATTENTION] if (plan.get("context") or {}).get("kind") == "ring" else []),
        f"vocab      {v['true']} -> {v['padded']} (multiple {v['multiple']} x tp {v['tp']}; {v['padding_rows']} padding rows, masked out of the loss)",
        f"tokenizer  {plan['tokenizer']['path']} (fingerprint {plan['tokenizer']['fingerprint']})",
        *([f"           {TokenizerMatch(**plan['tokenizer']['pretrained']).line()}"] if plan["tokenizer"].get("pretrained") else []),
        f"bos        {'on' if plan['tokenizer']['add_bos'] else 'off'}: {plan['tokenizer']['add_bos_reason']}",
        f"hardware   {where}",
        f"precision  {p['value']}: {p['reason']}",
    ]
    if p["loss_scale"]:
        ls = p["loss_scale"]
        # Hysteresis is DeepSpeed's alone: torch's GradScaler halves at every overflow.
        halving = f"hysteresis {ls['hysteresis']}" if plan.get("deepspeed") else "halved at every overflow (torch's GradScaler has no hysteresis)"
        lines.append(f"loss scale dynamic: start 2^{ls['initial_scale_power']}, grow after {ls['window']} clean steps, {halving}, minimum {ls['min_scale']}")
    return lines


def batch_rows(preference: dict | None) -> str:
    """What the batch line counts: sequences, or a preference objective's examples and their rows."""
    if not preference:
        return "sequences of "
    if preference["name"] == "kto":
        return "examples (each a completion and a KL row: its prompt with another example's completion) of up to "
    return "pairs (each a chosen and a rejected sequence) of up to "


def tokens_counted(preference: dict | None, padded: bool = False) -> str:
    """What the tokens line counts for a preference objective: one sequence per pair or example, not
    the rows it runs (the step's compute counts them: plan/preference.py step_work); for instruction
    data, rows of data.seq_len where each is padded only to its batch's longest."""
    if not preference:
        return " (sequences x data.seq_len: an upper bound, each batch is padded only to its longest)" if padded else ""
    return " (examples x data.seq_len; each with its KL row)" if preference["name"] == "kto" else " (pairs x data.seq_len; each trains its chosen and rejected rows)"


def layout_lines(plan: dict) -> list[str]:
    """Processes, batch and tokens."""
    c, b = plan["cluster"], plan["batch"]
    lines = [
        f"cluster    {c['name']}: {c['nodes']} node(s) x {c['devices_per_node']} device(s) per node, from {c['source']}",
        f"parallel   {plan['parallel']['strategy']}: world size {plan['world_size']} = tp {plan['parallel']['tp']}" + (f" x cp {plan['parallel']['cp']}" if plan["parallel"]["cp"] > 1 else "") + f" x dp {plan['parallel']['dp']}",
        f"batch      micro {b['micro_batch_size']} x accumulation {b['accumulate_grad_batches']} x dp {plan['parallel']['dp']} = {b['global_batch_size']} "
        + batch_rows(plan.get("preference"))
        + str(b["seq_len"]),
        f"tokens     {_human(plan['tokens_per_step'])} per step, {_human(plan['total_tokens'])} over {plan['max_steps']} steps" + tokens_counted(plan.get("preference"), plan.get("tokens_padded", False)),
    ]
    if plan.get("batch_size_warmup"):
        r = plan["batch_size_warmup"]
        lines.append(
            f"batch ramp {r['start']} -> {r['final']} sequences in steps of {r['increment']} (one more per micro batch) over the first {r['ramp_steps']} steps "
            f"({_human(r['ramp_tokens'])} tokens); the schedule counts tokens, in steps of the final batch"
        )
    return lines


def training_lines(plan: dict) -> list[str]:
    """What trains and how: schedule, data mixture, adapters, objective, optimizer."""
    lines = []
    if plan.get("schedule"):
        lines += render_schedule(plan["schedule"], plan["max_steps"], plan["resume"])
    if plan.get("data_mixture"):
        lines += render_mixture(plan["data_mixture"], plan["max_steps"])
    if plan.get("finetune"):
        ft = plan["finetune"]
        lines.append(
            f"finetune   {ft['method']}: rank {ft['rank']}, alpha {ft['alpha']:g}, dropout {ft['dropout']:g} on {', '.join(ft['target_modules'])}; "
            f"{_human(ft['adapter_params'])} adapter parameters, {_human(ft['trainable_params'])} trainable, base {ft['base']} frozen in {ft['frozen_dtype']}"
        )
        lines.append(f"token rows {ft['trainable_tokens_reason']}")
    if plan.get("preference"):
        pr = plan["preference"]
        settings = f"beta {pr['beta']:g}" + (f", label smoothing {pr['label_smoothing']:g}" if pr["label_smoothing"] else "") + (f", gamma {pr['simpo_gamma']:g}" if pr["name"] == "simpo" else "")
        lines.append(f"objective  {pr['name']}: {settings}; reference: {pr['reference']}")
    if plan.get("optimizer"):
        lines.append(optimizer_line(plan["optimizer"], plan["parallel"], deepspeed=plan["deepspeed"]))
    return lines


def fit_lines(plan: dict) -> list[str]:
    """How it fits the GPU: memory, context, checkpoint costs, recompute, fp8, fast paths, preflight."""
    b, m = plan["batch"], plan["memory_per_gpu"]
    lines = [f"memory     per GPU: {render_sum(m)}; {m['note']}{render_margin(m.get('margin'))}"]
    if m.get("activation_parts"):
        lines.append(render_activation_parts(m["activation_parts"]))
    if plan.get("host_memory"):
        lines += render_host(plan["host_memory"])
    if plan.get("context"):
        lines += render_context(plan["context"], b["seq_len"])
    if plan.get("checkpoint"):
        lines += render_checkpoint(plan["checkpoint"])
    if plan.get("activation_checkpointing"):
        lines += render_checkpointing(plan["activation_checkpointing"], b["micro_batch_size"])
    if plan.get("fp8"):
        lines.append(f"fp8        {'on' if plan['fp8']['enabled'] else 'off'}: {plan['fp8']['reason']}")
    f = plan["fast_paths"]
    on = [k for k in ("fused_adamw", "liger") if f[k]] + [f"{k} {f[k]}" for k in ("compile", "activation_checkpointing") if f[k] != "none"] + ([f"chunked loss ({f['loss_chunk_tokens']} tokens)"] if f["loss_chunk_tokens"] else [])
    compiled = f"; compile: {f['reasons']['compile']}" if f["compile"] != "none" else ""
    lines.append(f"fast paths {', '.join(on) if on else 'none beyond ' + plan['model']['attention']}; loss: {f['reasons']['loss_chunk_tokens']}; liger: {f['reasons']['liger']}{compiled}")
    if plan.get("evals"):
        lines.append(render_evals(plan["evals"], plan["max_steps"]))
    if plan.get("watchdog"):
        lines.append(f"watchdog   {plan['watchdog']['reason']}")
    if plan.get("stragglers"):
        lines.append(f"stragglers {plan['stragglers']['reason']}")
    if plan.get("health"):
        lines.append(f"health     {plan['health']['reason']}")
    if plan.get("profile"):
        lines.append(f"profile    {plan['profile']}")
    pf = plan["preflight"]
    warnings = [w for w in pf["findings"] if w["severity"] == "warn"]
    fixed = f"; untrained rows fixed with {pf['fix']}: {'; '.join(pf['untrained_rows'])}" if pf["fix"] else ""
    lines.append(f"preflight  {'ok' if not warnings else str(len(warnings)) + ' warning(s): ' + ' | '.join(w['message'] for w in warnings)}{fixed}")
    return lines


def start_lines(plan: dict) -> list[str]:
    """Where the run starts (init_from, resume) and the DeepSpeed config it runs with."""
    v = plan["vocab"]
    lines = []
    if plan["init_from"]:
        i = plan["init_from"]
        if plan["resume"]:  # a requeued fine-tune continues instead of starting again from the base
            lines.append(f"init from  {i['path']}: not applied, the run resumes from its own checkpoint (below)")
        else:
            lines.append(f"init from  {i['path']}: {i['true_vocab']} rows saved with tp {i['tp']} -> re-padded to {v['padded']} for tp {v['tp']}")
            if i.get("tokenizer_change"):
                lines.append(f"init from  {i['tokenizer_change']}")
    if plan["resume"]:
        r = plan["resume"]
        lines.append(f"resume     {r['how']}: {r['path']} (step {r['step']}); weights, optimizer, its place on the schedule, loss scale, data position and RNG from it")
        for change in ("tokenizer_change", "batch_change", "numerics_change", "rate_change"):
            if r.get(change):
                lines.append(f"resume     {r[change]}")
        if r.get("universal"):
            lines.append(
                f"resume     saved on another number of DeepSpeed partitions (data parallel x cp): rank 0 converts it to DeepSpeed's universal checkpoint {r['universal']} (deepspeed.checkpoint.ds_to_universal; the fp32 master weights and Adam moments re-partitioned exactly), loaded with load_universal; the data position is counted in global batches, so no sample repeats"
            )
    if plan["deepspeed"]:
        ds = plan["deepspeed"]
        zero = ds["zero_optimization"]
        offload = [k.removeprefix("offload_") for k in ("offload_optimizer", "offload_param") if k in zero]
        dtype = "bf16" if "bf16" in ds else "fp16" if "fp16" in ds else "fp32"
        on_cpu = " (on DeepSpeed's CPU accelerator: parallel.deepspeed_on_cpu, for tests only)" if plan["parallel"]["deepspeed_on_cpu"] else ""
        lines.append(f"deepspeed  ZeRO stage {zero['stage']}{' offload ' + '+'.join(offload) if offload else ''}, {dtype}, written to deepspeed_config.json{on_cpu}")
        if zero["stage"] == 3:
            lines.append("           each decoder layer gathered whole, around its call (a DeepSpeed leaf module, as FSDP2 gathers per block)")
    return lines

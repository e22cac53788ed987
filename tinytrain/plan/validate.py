"""Semantic checks on a composed config, all reported together before anything is built.

Hydra and the schemas already rejected unknown keys and wrong types; these are the problems
that need more than one key to see (tp vs heads, batch arithmetic, paths that must exist).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from tinytrain.checkpoint.pretrained import is_hub_id
from tinytrain.checkpoint.sharded import is_sharded
from tinytrain.cluster.sbatch import sbatch_problems
from tinytrain.cluster.slurm import allocation_problems, current_task
from tinytrain.config import CONF_DIR
from tinytrain.config.resolvers import run_name_problem
from tinytrain.config.schema import (
    Arch,
    DataFormat,
    DataSource,
    LossScaleConfig,
    LrSchedule,
    Mode,
    ModelConfig,
    Strategy,
)
from tinytrain.data import mixture, parts, shards
from tinytrain.data.chat_templates import template_problems
from tinytrain.data.tokenizer import (
    check_tokenizer_path,
    load_from_config,
    load_tokenizer,
)
from tinytrain.errors import ConfigError, Problem, raise_if_any
from tinytrain.plan import finetune, input_safety, preference
from tinytrain.plan import hardware as hw_table
from tinytrain.plan.extras import missing_extra_problems
from tinytrain.plan.families import family, tp_problems
from tinytrain.plan.layout import batch_layout, devices_per_node, world_size
from tinytrain.plan.schedule import decay_steps
from tinytrain.preflight import rope

DEFAULT_MODEL = ModelConfig()  # model=tiny: the example values in fixes
# Model sizes that must be positive; checked first, since the divisibility checks divide by them.
POSITIVE_MODEL_SIZES = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "max_position_embeddings")


def model_problems(cfg) -> list[Problem]:
    m, tp = cfg.model, cfg.parallel.tp
    problems = [
        Problem(f"model.{key}", getattr(m, key), "must be a positive integer", f"use e.g. model.{key}={getattr(DEFAULT_MODEL, key)} (model=tiny's), or pick a model= option")
        for key in POSITIVE_MODEL_SIZES
        if getattr(m, key) < 1
    ]
    for key in ("rope_theta", "rms_norm_eps", "initializer_range"):
        if not getattr(m, key) > 0:
            problems.append(Problem(f"model.{key}", getattr(m, key), "must be positive", f"use e.g. model.{key}={getattr(DEFAULT_MODEL, key)}"))
    if problems:
        return problems
    if m.head_dim is None and m.hidden_size % m.num_heads:
        problems.append(Problem("model.num_heads", m.num_heads, f"must divide hidden_size({m.hidden_size})", "pick a head count that divides the hidden size, or set model.head_dim"))
    problems += family_problems(m)
    if m.num_heads % m.num_kv_heads:
        problems.append(Problem("model.num_kv_heads", m.num_kv_heads, f"must divide num_heads({m.num_heads}) for grouped-query attention", "pick a KV head count that divides the head count"))
    if tp < 1:
        problems.append(Problem("parallel.tp", tp, "must be >= 1", "use parallel.tp=1 for no tensor parallelism"))
        return problems
    if m.num_heads % tp:
        problems.append(Problem("parallel.tp", tp, f"tp({tp}) must divide num_heads({m.num_heads}) of model={m.name}", f"use a tp that divides {m.num_heads}"))
    if m.num_kv_heads % tp:
        problems.append(Problem("parallel.tp", tp, f"tp({tp}) must divide num_kv_heads({m.num_kv_heads}) of model={m.name}", f"use a tp that divides {m.num_kv_heads}"))
    if m.vocab_multiple < 1:
        problems.append(Problem("model.vocab_multiple", m.vocab_multiple, "must be >= 1", "use 64 (the default) or 128"))
    if m.pretrained and not is_hub_id(m.pretrained) and not (Path(m.pretrained) / "config.json").is_file():
        problems.append(Problem("model.pretrained", m.pretrained, "no config.json there", "point model.pretrained at a local Hugging Face model folder (save_pretrained output), or a hub id (org/name)"))
    return problems


def family_problems(m) -> list[Problem]:
    """Keys that only some families' transformers classes take, and model.rope_scaling."""
    fam = family(m.arch)
    problems = []
    for key in ("head_dim", "sliding_window"):
        if getattr(m, key) is not None and getattr(m, key) < 1:
            problems.append(Problem(f"model.{key}", getattr(m, key), "must be a positive integer", f"use null for the default (model.{key}=null)"))
    if m.sliding_window is not None and not fam.sliding_window:
        problems.append(Problem("model.sliding_window", m.sliding_window, f"model.arch={m.arch.value} has no sliding-window attention", "use model.sliding_window=null, or a family that has it (mistral, gemma2, phi3, gemma3_text)"))
    if m.head_dim is not None and not fam.head_dim and m.head_dim * m.num_heads != m.hidden_size:
        problems.append(Problem("model.head_dim", m.head_dim, f"model.arch={m.arch.value} derives it as hidden_size / num_heads ({m.hidden_size} / {m.num_heads})", "use model.head_dim=null"))
    for key, what in (("sliding_window_pattern", "must be a positive integer (every Nth layer attends globally)"), ("rope_local_theta", "must be positive (the sliding-window layers' RoPE base)")):
        value = getattr(m, key)
        if value is None:
            continue
        if m.arch != Arch.gemma3_text:
            problems.append(Problem(f"model.{key}", value, f"only model.arch=gemma3_text has it (this is {m.arch.value})", f"use model.{key}=null"))
        elif not value > 0:
            problems.append(Problem(f"model.{key}", value, what, f"use null for the family's (model.{key}=null), e.g. Gemma-3's {6 if key == 'sliding_window_pattern' else 10000.0}"))
    if m.attention_bias and fam.qkv_bias == "never":
        problems.append(Problem("model.attention_bias", True, f"model.arch={m.arch.value} has no q/k/v biases", "use model.attention_bias=false"))
    return problems + rope.scaling_problems(m.rope_scaling)


def cluster_problems(cfg) -> list[Problem]:
    c = cfg.cluster
    problems = []
    if c.nodes < 1:
        problems.append(Problem("cluster.nodes", c.nodes, "must be >= 1", "use cluster.nodes=1 for one machine"))
    if c.devices is not None and c.devices < 1:
        problems.append(Problem("cluster.devices", c.devices, "must be >= 1 (processes per node)", "use the GPUs per node, 1 on a CPU, or null for every visible GPU"))
    return problems


def parallel_problems(cfg) -> list[Problem]:
    par = cfg.parallel
    problems = override_problems(cfg)
    if problems:
        return problems
    if par.tp > 1 and par.strategy != Strategy.fsdp_tp:
        # Batch arithmetic depends on tp, so it is checked once tp is possible at all.
        fix = "use parallel.tp=1, or parallel=fsdp_tp for tensor parallelism"
        return [Problem("parallel.tp", par.tp, f"parallel={par.name} has no tensor parallelism", fix)]
    world = world_size(cfg)
    if par.strategy == Strategy.deepspeed:
        problems += deepspeed_problems(cfg)
    if par.strategy == Strategy.fsdp_tp:
        problems += fsdp_tp_problems(cfg, world)
    if cfg.parallel.strategy == Strategy.single and world > 1:
        problems.append(
            Problem("parallel", cfg.parallel.name, f"runs one process but the cluster has {world} (nodes {cfg.cluster.nodes} x devices {cfg.cluster.devices})", "use parallel=ddp, or cluster.devices=1")
        )
    _, batch = batch_layout(cfg, world)
    return problems + batch


def override_problems(cfg) -> list[Problem]:
    """`parallel.deepspeed_overrides` may tune DeepSpeed, not contradict `parallel=`: the stage and
    the offloads decide the optimizer (DeepSpeedCPUAdam) and the memory plan too."""
    par = cfg.parallel
    overrides = par.deepspeed_overrides
    if not overrides:
        return []
    if par.strategy != Strategy.deepspeed:
        return [Problem("parallel.deepspeed_overrides", dict(overrides), f"parallel={par.name} does not run DeepSpeed, so these would be ignored", "remove them, or pick parallel=zero1|zero2|zero3|zero2_offload|zero3_offload")]
    zero = overrides.get("zero_optimization") or {}
    problems = []
    if "stage" in zero and zero["stage"] != par.zero_stage:
        problems.append(Problem("parallel.deepspeed_overrides.zero_optimization.stage", zero["stage"], f"contradicts parallel={par.name} (ZeRO stage {par.zero_stage})", f"pick the stage with parallel=zero{zero['stage']} and remove the override"))
    for key, flag, option in (("offload_optimizer", "offload_optimizer", "zero2_offload or zero3_offload"), ("offload_param", "offload_params", "zero3_offload")):
        if key in zero and getattr(par, flag) != _offloads(zero[key]):
            problems.append(Problem(f"parallel.deepspeed_overrides.zero_optimization.{key}", zero[key], f"contradicts parallel={par.name} (parallel.{flag}={getattr(par, flag)})", f"pick the offload with parallel={option} (or without), and remove the override"))
    return problems


def _offloads(block) -> bool:
    return hasattr(block, "get") and block.get("device", "none") not in ("none", None)


def deepspeed_problems(cfg) -> list[Problem]:
    par = cfg.parallel
    problems = []
    if par.zero_stage not in (1, 2, 3):
        problems.append(Problem("parallel.zero_stage", par.zero_stage, "must be 1, 2 or 3", "pick parallel=zero1|zero2|zero3|zero2_offload|zero3_offload"))
    if par.offload_params and par.zero_stage != 3:
        problems.append(Problem("parallel.offload_params", True, f"parameter offload needs ZeRO stage 3 (got {par.zero_stage})", "use parallel=zero3_offload"))
    if cfg.mode == Mode.train and not par.deepspeed_on_cpu and _no_cuda():
        problems.append(
            Problem(
                "parallel",
                par.name,
                "Lightning's DeepSpeedStrategy runs only on CUDA GPUs and this machine has none (parallel.deepspeed_on_cpu=true runs it on CPU for tests only: slow, and proves nothing about NCCL or GPU memory)",
                "plan it here with mode=plan hardware.gpu=A800 (or V100), train it on a GPU node, or use parallel=ddp on CPU",
            )
        )
    return problems


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def fsdp_tp_problems(cfg, world: int) -> list[Problem]:
    par = cfg.parallel
    problems = []
    if par.dp is not None and par.dp * par.tp != world:
        problems.append(Problem("parallel.dp", par.dp, f"dp({par.dp}) x tp({par.tp}) must equal the world size {world} (nodes {cfg.cluster.nodes} x devices {devices_per_node(cfg)})", "leave parallel.dp=null to derive it"))
    if cfg.model.tie_word_embeddings:
        problems.append(Problem("model.tie_word_embeddings", True, f"parallel=fsdp_tp does not shard tied embeddings (model={cfg.model.name})", "use parallel=ddp or zero2/zero3 for this model"))
    if not cfg.model.pretrained:  # a pretrained model's family is checked on the built model
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        arch = cfg.model.arch.value
        problems += tp_problems(CONFIG_MAPPING[arch].base_model_tp_plan, arch)
    return problems


RECORD_SOURCES = (DataSource.jsonl, DataSource.parquet, DataSource.hf)


def data_problems(cfg) -> list[Problem]:
    d = cfg.data
    problems = []
    if d.seq_len < 2:
        problems.append(Problem("data.seq_len", d.seq_len, "must be >= 2", "use e.g. data.seq_len=256"))
    max_pos = cfg.model.max_position_embeddings
    # With RoPE scaling (or a pretrained model's config) preflight's positions check decides.
    if not cfg.model.pretrained and not cfg.model.rope_scaling and d.seq_len > max_pos:
        problems.append(Problem("data.seq_len", d.seq_len, f"longer than model.max_position_embeddings({max_pos})", f"use data.seq_len<={max_pos} or raise model.max_position_embeddings"))
    if d.val_path is None and not 0.0 < d.val_fraction < 1.0:
        problems.append(Problem("data.val_fraction", d.val_fraction, "must be between 0 and 1", "use e.g. data.val_fraction=0.05, or a separate data.val_path"))
    sft = d.format != DataFormat.text
    if sft and d.source not in RECORD_SOURCES:
        problems.append(Problem("data.format", d.format.value, f"SFT records come from jsonl, parquet or hf sources, not data.source={d.source.value}", "set data.source=jsonl (or parquet, hf)"))
    if d.store and sft:
        problems.append(Problem("data.store", d.store, f"a token store holds pretraining text, but data.format={d.format.value} (SFT data is tokenized at the start of each run)", "remove data.store"))
    elif d.store and (Path(d.store) / parts.PLAN).is_file() and not (Path(d.store) / parts.MANIFEST).is_file():
        missing = parts.missing_parts(Path(d.store))
        listed, n = ", ".join(str(i) for i, _ in missing) or "none", missing[0][1] if missing else "?"
        first = missing[0][0] if missing else 0
        problems.append(Problem("data.store", d.store, f"incomplete: part(s) {listed} of {n} not built (no manifest.json yet)", f"build them: python -m tinytrain mode=prepare <the same data options> data.prepare_parts={n} data.prepare_part={first} (or without data.prepare_part: every missing part)"))
    elif d.store and not ((Path(d.store) / "meta.json").is_file() or (Path(d.store) / parts.MANIFEST).is_file()):
        problems.append(Problem("data.store", d.store, "not a token store (no meta.json there)", "point it at a store folder printed by mode=prepare, or remove data.store to use the cache"))
    elif not d.store and not d.sources:
        problems += source_path_problems(d.source, d.path, "data.path")
    if d.sources:
        problems += mixture_problems(cfg)
        problems += stage_problems(cfg)
    elif d.stages:
        problems.append(Problem("data.stages", f"[{len(d.stages)} stage(s)]", "change a mixture's weights, and data.sources names no mixture", "add data.sources=[{path: ..., weight: ...}, ...] (data=mixture), or remove data.stages"))
    elif d.val_path is not None:
        problems += source_path_problems(d.source, d.val_path, "data.val_path")
    for key in ("num_workers", "tokenize_workers"):
        value = getattr(d, key)
        if value is not None and value < 0:
            problems.append(Problem(f"data.{key}", value, "must be >= 0", "use 0 to work in the training process"))
    problems += part_problems(cfg)
    if d.pad_to_multiple_of < 1:
        problems.append(Problem("data.pad_to_multiple_of", d.pad_to_multiple_of, "must be >= 1", "use 8 (the default) or 1 for no rounding"))
    return problems + chat_template_problems(cfg)


def part_problems(cfg) -> list[Problem]:
    """data.prepare_parts / data.prepare_part: a file source's token store built in parts."""
    d = cfg.data
    if d.prepare_parts < 1:
        return [Problem("data.prepare_parts", d.prepare_parts, "must be >= 1", "use 1 (one store) or the number of parts to build in parallel")]
    problems = []
    if d.prepare_parts > 1:
        if d.format != DataFormat.text or d.source not in shards.FILE_SOURCES or d.sources or d.store:
            why = "SFT data is not a token store" if d.format != DataFormat.text else "only a file source's token store (data.path of shards) is built in parts"
            problems.append(Problem("data.prepare_parts", d.prepare_parts, why, "use data.prepare_parts=1"))
        elif d.path:
            try:
                n = len(shards.list_shards(d.path, "data.path", d.source))
            except ConfigError:
                n = None  # named by the source's own check
            if n is not None and d.prepare_parts > n:
                problems.append(Problem("data.prepare_parts", d.prepare_parts, f"data.path has {n} shard file(s); a part is at least one file", f"use data.prepare_parts<={n}"))
    if d.prepare_part is not None:
        if cfg.mode != Mode.prepare:
            problems.append(Problem("data.prepare_part", d.prepare_part, f"builds one part and stops; it is for mode=prepare, not mode={cfg.mode.value}", "remove data.prepare_part, or use mode=prepare"))
        if not 0 <= d.prepare_part < d.prepare_parts:
            problems.append(Problem("data.prepare_part", d.prepare_part, f"out of range: data.prepare_parts={d.prepare_parts} makes parts 0..{d.prepare_parts - 1}", f"use data.prepare_part between 0 and {d.prepare_parts - 1}"))
    return problems


def mixture_problems(cfg) -> list[Problem]:
    """data.sources: each entry a readable source with a positive weight and its own name, and no
    single-source key that would also name training data."""
    d = cfg.data
    problems = []
    for key, why in (("path", "names one source's data while data.sources names a mixture: which to train on is ambiguous"), ("store", "names one token store while data.sources names a mixture: which to train on is ambiguous"), ("val_path", "a mixture splits validation off each source by data.val_fraction")):
        if getattr(d, key):
            problems.append(Problem(f"data.{key}", getattr(d, key), why, f"set data.{key}=null (data=mixture has none), or drop data.sources for one source"))
    names: dict[str, int] = {}
    sft = d.format != DataFormat.text
    for i, entry in enumerate(d.sources):
        key = f"data.sources[{i}]"
        if entry.weight is None:
            problems.append(Problem(f"{key}.weight", None, "is missing; every mixture source needs a weight", f"add one: {{path: {entry.path}, weight: 0.5}} (weights are relative)"))
        elif not (math.isfinite(entry.weight) and entry.weight > 0):
            problems.append(Problem(f"{key}.weight", entry.weight, "must be a positive number (a source is drawn with probability weight / the sum of the weights)", "use e.g. weight: 0.7 and weight: 0.3, or remove the source"))
        kind = mixture.kind(entry, d)
        if kind == DataSource.pydoc and entry.path:
            problems.append(Problem(f"{key}.path", entry.path, "a pydoc source is the embedded corpus and takes no path", f"set {key}.source=text (or jsonl, parquet, hf), or remove the path"))
        elif kind != DataSource.pydoc and not entry.path:
            problems.append(Problem(f"{key}.path", entry.path, "is missing; every mixture source needs a file or folder", f"add one: {{path: data.txt, weight: {entry.weight or 0.5}}}"))
        else:
            problems += source_path_problems(kind, entry.path, f"{key}.path")
        if sft and kind not in RECORD_SOURCES:
            problems.append(Problem(f"{key}.source", kind.value, f"SFT records (data.format={d.format.value}) come from jsonl, parquet or hf sources", f"point {key}.path at a .jsonl file, or set {key}.source"))
        name = mixture.default_name(entry, d)
        if name in names:
            problems.append(Problem(f"{key}.name", name, f"data.sources[{names[name]}] has this name too; checkpoints keep each source's position by name", f"name one of them: {key}.name=<another name>"))
        names.setdefault(name, i)
    return problems


def stage_problems(cfg) -> list[Problem]:
    """data.stages: in order of until_step, within trainer.max_steps, each naming only the mixture's
    sources with weights that draw something."""
    d, max_steps = cfg.data, cfg.trainer.max_steps
    names = [mixture.default_name(entry, d) for entry in d.sources]
    problems, previous = [], 0
    for i, stage in enumerate(d.stages):
        key, until = f"data.stages[{i}]", stage.until_step
        if until is None and i < len(d.stages) - 1:
            problems.append(Problem(f"{key}.until_step", None, "null (to the end of the run) is for the last stage only", f"give it the step the next stage starts at: {key}.until_step=<step>"))
        elif until is not None and until > max_steps:
            problems.append(Problem(f"{key}.until_step", until, f"is beyond trainer.max_steps({max_steps})", f"use a step up to {max_steps}, null for the run's end, or raise trainer.max_steps"))
        elif until is not None and until <= previous:
            problems.append(Problem(f"{key}.until_step", until, f"stages go in order: it must be after the previous stage's end (step {previous})", "list the stages by until_step, each later than the one before"))
        previous = until if until is not None else previous
        unknown = sorted(set(stage.weights) - set(names))
        for name in unknown:
            problems.append(Problem(f"{key}.weights.{name}", stage.weights[name], f"names no mixture source (the sources are {', '.join(names)})", "use one of those names (data.sources[i].name, or the file name without suffix)"))
        bad = {n: w for n, w in stage.weights.items() if not (math.isfinite(w) and w >= 0)}
        for name, w in bad.items():
            problems.append(Problem(f"{key}.weights.{name}", w, "must be >= 0 (relative; 0 draws nothing from it)", "use e.g. 0.3"))
        if not unknown and not bad and not any(w > 0 for w in stage.weights.values()):
            problems.append(Problem(f"{key}.weights", dict(stage.weights), "draws from no source (every weight 0, or none given)", f"give at least one source a positive weight, e.g. {{{names[0]}: 1.0}}"))
    return problems


def _empty_file_problem(files: list[Path], key: str, path: str, is_file: bool) -> list[Problem]:
    if all(f.stat().st_size == 0 for f in files):
        return [Problem(key, path, "is empty" if is_file else "holds only empty files", f"point {key} at data with documents in it")]
    return []


def source_path_problems(source: DataSource, path: str | None, key: str) -> list[Problem]:
    if source == DataSource.pydoc:
        if key == "data.val_path":
            return [Problem(key, path, "data.source=pydoc is one embedded corpus; it is split by data.val_fraction", "remove data.val_path")]
        return []
    if not path:
        return [Problem(key, path, f"data.source={source.value} needs a path", f"set {key} to a file or folder")]
    p = Path(path)
    if source == DataSource.hf:
        looks_local = path.startswith((".", "/", "~")) or p.suffix != ""
        if looks_local and not p.exists():
            return [Problem(key, path, "no such folder", "point it at a save_to_disk folder, a folder of data files, or a hub name")]
        return []
    try:
        listed = shards.list_shards(path, key, source)
    except ConfigError as e:
        return e.problems
    unreadable = [f for f in listed if not os.access(f, os.R_OK)]
    if unreadable:
        return [Problem(key, path, f"not readable: {unreadable[0]}", f"point {key} at readable shards ({shards.READABLE})")]
    return _empty_file_problem(listed, key, path, p.is_file())


def chat_template_problems(cfg) -> list[Problem]:
    """ChatML needs its markers as special tokens; `tokenizer` needs the tokenizer to have a
    template. Checked on the loaded tokenizer (some ship the markers already)."""
    if cfg.data.format == DataFormat.text or check_tokenizer_path(str(cfg.tokenizer.path)) is not None:
        return []
    try:
        tokenizer = load_from_config(cfg.tokenizer)
    except ConfigError:
        return []  # the tokenizer's own problem is reported when it loads
    return template_problems(cfg.data.chat_template, tokenizer)


def schedule_problems(t) -> list[Problem]:
    """A WSD decay must fit in the run after the warm-up (tinytrain/plan/schedule.py)."""
    if t.lr_schedule != LrSchedule.wsd:
        if t.decay_steps is not None:
            return [Problem("trainer.decay_steps", t.decay_steps, f"only trainer.lr_schedule=wsd has a decay of its own length ({t.lr_schedule.name} decays over the whole run after the warm-up)", "set trainer.lr_schedule=wsd, or trainer.decay_steps=null")]
        return []
    if t.decay_steps is None and not 0.0 < t.decay_fraction <= 1.0:
        return [Problem("trainer.decay_fraction", t.decay_fraction, "must be in (0, 1]: the share of trainer.max_steps the decay takes", "use e.g. trainer.decay_fraction=0.2 (the last 20% of the run)")]
    key, value = ("trainer.decay_steps", t.decay_steps) if t.decay_steps is not None else ("trainer.decay_fraction", t.decay_fraction)
    steps = decay_steps(t)
    room = t.max_steps - max(0, t.warmup_steps)
    if steps < 1 or steps > room:
        return [
            Problem(
                key,
                value,
                f"a decay of {steps} steps does not fit in the run: trainer.max_steps({t.max_steps}) - trainer.warmup_steps({t.warmup_steps}) = {room} steps after the warm-up",
                f"use a decay of 1 to {room} steps (trainer.decay_steps=<n> or a smaller trainer.decay_fraction), or raise trainer.max_steps to continue the run into a longer decay",
            )
        ]
    return []


def trainer_problems(cfg) -> list[Problem]:
    t = cfg.trainer
    problems = []
    for key in ("max_steps", "micro_batch_size", "log_every_n_steps", "val_every_n_steps", "checkpoint_every_n_steps"):
        if getattr(t, key) < 1:
            problems.append(Problem(f"trainer.{key}", getattr(t, key), "must be >= 1", "use a positive integer"))
    if t.warmup_steps < 0 or t.warmup_steps >= t.max_steps:
        problems.append(Problem("trainer.warmup_steps", t.warmup_steps, f"must be >= 0 and below trainer.max_steps({t.max_steps})", "shorten the warm-up"))
    if t.lr <= 0:
        problems.append(Problem("trainer.lr", t.lr, "must be positive", "use e.g. trainer.lr=3e-4"))
    problems += schedule_problems(t)
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        problems.append(Problem("trainer.min_lr_ratio", t.min_lr_ratio, "must be between 0 and 1", "use e.g. 0.1"))
    if len(t.betas) != 2:
        problems.append(Problem("trainer.betas", list(t.betas), "needs two values", "use e.g. trainer.betas=[0.9,0.95]"))
    elif not all(0.0 <= b < 1.0 for b in t.betas):
        problems.append(Problem("trainer.betas", list(t.betas), "each must be in [0, 1) (AdamW's moment decay rates)", "use e.g. trainer.betas=[0.9,0.95]"))
    if not t.eps > 0:
        problems.append(Problem("trainer.eps", t.eps, "must be positive (AdamW divides by sqrt(v) + eps)", "use e.g. trainer.eps=1e-8"))
    for key, fix in (("weight_decay", "use 0 for none, e.g. 0.1"), ("grad_clip", "use 0 for no clipping, e.g. 1.0"), ("val_batches", "use 0 for no validation, e.g. 8")):
        if getattr(t, key) < 0:
            problems.append(Problem(f"trainer.{key}", getattr(t, key), "must be >= 0", fix))
    for key in ("global_batch_size", "accumulate_grad_batches"):
        if getattr(t, key) is not None and getattr(t, key) < 1:
            problems.append(Problem(f"trainer.{key}", getattr(t, key), "must be >= 1", f"use a positive integer, or null to derive it (trainer.{key}=null)"))
    if t.loss_chunk_tokens is not None and t.loss_chunk_tokens < 0:
        problems.append(Problem("trainer.loss_chunk_tokens", t.loss_chunk_tokens, "must be >= 0", "use 0 for plain cross-entropy, null to decide by vocab size, or e.g. 1024"))
    return problems


# Each overflowing step halves the scale once and is skipped: a start above 2^32 skips dozens of
# steps on the way down (DeepSpeed's default start is 2^16).
MAX_SCALE_POWER = 32


def precision_problems(cfg) -> list[Problem]:
    ls = cfg.precision.loss_scale
    problems = []
    if not 0 <= ls.initial_scale_power <= MAX_SCALE_POWER:
        problems.append(Problem("precision.loss_scale.initial_scale_power", ls.initial_scale_power, f"must be between 0 and {MAX_SCALE_POWER} (the scale starts at 2^power)", "use 16 (the default), or 12 for fragile models"))
    for key in ("window", "hysteresis"):
        if getattr(ls, key) < 1:
            problems.append(Problem(f"precision.loss_scale.{key}", getattr(ls, key), "must be >= 1", f"use e.g. precision.loss_scale.{key}={getattr(LossScaleConfig(), key)}"))
    if not ls.min_scale > 0:
        problems.append(Problem("precision.loss_scale.min_scale", ls.min_scale, "must be positive", "use e.g. precision.loss_scale.min_scale=1"))
    elif 0 <= ls.initial_scale_power <= MAX_SCALE_POWER and ls.min_scale > 2.0**ls.initial_scale_power:
        problems.append(
            Problem("precision.loss_scale.min_scale", ls.min_scale, f"above the initial scale 2^{ls.initial_scale_power} = {2.0**ls.initial_scale_power:g}", "lower min_scale, or raise precision.loss_scale.initial_scale_power")
        )
    return problems


def guard_problems(cfg) -> list[Problem]:
    g = cfg.guard
    problems = []
    if g.max_consecutive_skips < 0:
        problems.append(Problem("guard.max_consecutive_skips", g.max_consecutive_skips, "must be >= 0", "use 0 to stop at the first non-finite step, e.g. 3"))
    if g.loss_scale_halvings < 1:
        problems.append(Problem("guard.loss_scale_halvings", g.loss_scale_halvings, "must be >= 1", "use e.g. 8"))
    if not g.grad_spike_factor > 1:
        problems.append(Problem("guard.grad_spike_factor", g.grad_spike_factor, "must be above 1 (a spike is a norm this many times the running average)", "use e.g. 5"))
    if g.grad_spike_warmup < 0:
        problems.append(Problem("guard.grad_spike_warmup", g.grad_spike_warmup, "must be >= 0", "use e.g. 20"))
    return problems


def run_name_problems(cfg) -> list[Problem]:
    problem = run_name_problem(str(cfg.run.name))
    return [problem] if problem else []


WANDB_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")


def wandb_problems(cfg) -> list[Problem]:
    lg = cfg.logger
    if not lg.wandb:
        return []
    problems = []
    if not str(lg.wandb_project).strip():
        problems.append(Problem("logger.wandb_project", lg.wandb_project, "is empty", "use e.g. logger.wandb_project=tinytrain"))
    mode = os.environ.get("WANDB_MODE")
    if mode is not None and mode not in WANDB_MODES:
        problems.append(Problem("WANDB_MODE", mode, f"is not a wandb mode ({', '.join(WANDB_MODES)})", "export WANDB_MODE=offline (no key or network needed) or online"))
    elif cfg.mode == Mode.train and mode in (None, "online", "run", "shared") and not _wandb_key():
        problems.append(
            Problem("logger", "wandb", "wandb would log online but finds no API key (WANDB_API_KEY, or `wandb login`'s ~/.netrc entry)", "export WANDB_MODE=offline (sync later with `wandb sync`), or run `wandb login` / set WANDB_API_KEY")
        )
    return problems


def _wandb_key() -> bool:
    import netrc
    from urllib.parse import urlparse

    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def special_token_problems(cfg) -> list[Problem]:
    """Added special tokens must be new, distinct, non-blank strings: turning a word the tokenizer
    already has into a special token silently changes how every text containing it tokenizes."""
    tokens = list(cfg.tokenizer.add_special_tokens)
    key = "tokenizer.add_special_tokens"
    blank = [t for t in tokens if not str(t).strip()]
    if blank:
        return [Problem(key, tokens, f"holds a blank token {blank[0]!r}", "remove it; special tokens are strings like <|im_start|>")]
    repeated = sorted({t for t in tokens if tokens.count(t) > 1})
    if repeated:
        return [Problem(key, tokens, f"lists {', '.join(repeated)} more than once", "list each token once")]
    if not tokens or check_tokenizer_path(str(cfg.tokenizer.path)) is not None:
        return []
    try:
        base = load_tokenizer(str(cfg.tokenizer.path))
    except ConfigError:
        return []  # the tokenizer's own problem is reported when it loads
    special = set(base.all_special_tokens) | set(base.get_added_vocab())
    ordinary = [t for t in tokens if t in base.get_vocab() and t not in special]
    if ordinary:
        return [Problem(key, tokens, f"{', '.join(map(repr, ordinary))} is already an ordinary token of the tokenizer; as a special token it would no longer be split or merged in text", "add only new marker strings (e.g. <|im_start|>), or leave the word as it is")]
    return []


def experiment_problems() -> list[Problem]:
    """`experiment` is an optional group, and Hydra skips a missing optional option silently."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    choice = HydraConfig.get().runtime.choices.get("experiment")
    folder = CONF_DIR / "experiment"
    options = sorted(p.stem for p in folder.glob("*.yaml"))
    if choice not in (None, "null") and choice not in options:
        return [Problem("experiment", choice, f"no such option in config group 'experiment' (available: {', '.join(options)})", "pick one of those, or add experiment/<name>.yaml to tinytrain/conf/ or to your own --config-dir")]
    return []


def hardware_problems(cfg) -> list[Problem]:
    name = cfg.hardware.gpu
    if name and hw_table.lookup_gpu(name) is None:
        return [Problem("hardware.gpu", name, "unknown GPU", f"use one of {', '.join(hw_table.known_gpu_names())}")]
    return []


def checkpoint_problems(cfg) -> list[Problem]:
    problems = []
    path = cfg.checkpoint.init_from
    if path and not (Path(path).is_file() or is_sharded(Path(path))):
        problems.append(Problem("checkpoint.init_from", path, "no such checkpoint file", "point it at a .ckpt file (or an fsdp_tp run's sharded .ckpt folder) from a tinytrain run's checkpoints/ folder"))
    if cfg.checkpoint.async_save and cfg.parallel.strategy != Strategy.fsdp_tp:
        problems.append(
            Problem(
                "checkpoint.async_save",
                True,
                f"writes sharded checkpoints in the background, which only parallel=fsdp_tp saves (this run: parallel={cfg.parallel.name})",
                "drop checkpoint.async_save, or train with parallel=fsdp_tp",
            )
        )
    last = cfg.checkpoint.average_last
    if last is not None and (last < 2 or (cfg.mode != Mode.average and last > cfg.checkpoint.keep_last)):
        problems.append(Problem("checkpoint.average_last", last, f"averages the run's newest step checkpoints: at least 2, and at most the checkpoint.keep_last({cfg.checkpoint.keep_last}) the run keeps", f"use 2 to {max(2, cfg.checkpoint.keep_last)} (raise checkpoint.keep_last to average more), or null for no average"))
    if cfg.checkpoint.keep_last < 1:
        problems.append(Problem("checkpoint.keep_last", cfg.checkpoint.keep_last, "must be >= 1 (resuming needs a checkpoint)", "keep at least 1; 2 or more survive a checkpoint lost to a full disk"))
    resume = cfg.resume
    if resume not in ("auto", "never") and not Path(resume).exists():
        problems.append(
            Problem("resume", resume, "is neither auto, never, nor an existing checkpoint", "use resume=auto (the newest checkpoint of the run directory), resume=never, or the path of a .ckpt file")
        )
    return problems


def tokenizer_problems(cfg) -> list[Problem]:
    problem = check_tokenizer_path(str(cfg.tokenizer.path))
    return [problem] if problem else []


def slurm_problems(cfg) -> list[Problem]:
    """mode=sbatch needs the Slurm settings; inside a Slurm job, training needs the config's
    nodes x devices to be the job's tasks."""
    if cfg.mode == Mode.sbatch:
        return sbatch_problems(cfg)
    task = current_task()
    if cfg.mode != Mode.train or task is None:
        return []
    return allocation_problems(cfg.cluster.nodes, devices_per_node(cfg), cfg.cluster.name, task)


def unknown_key_problems(cfg) -> list[Problem]:
    """Keys added with `+key=value` that no schema declares (Hydra lets `+` add anything), at any depth."""
    from tinytrain.config.schema import Config

    return _unknown_keys(cfg, Config, "")


def _unknown_keys(node, schema, prefix: str) -> list[Problem]:
    import dataclasses
    import difflib

    from omegaconf import DictConfig

    fields = {f.name: f for f in dataclasses.fields(schema)}
    problems = []
    for key in node:
        full = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            fix = f"did you mean {prefix}{close[0]}? Otherwise remove it" if close else "remove it"
            problems.append(Problem(full, node[key], "is not a tinytrain config key", f"{fix}; the keys there are {', '.join(sorted(fields))}"))
            continue
        sub = fields[key].default_factory if fields[key].default_factory is not dataclasses.MISSING else None
        # _get_node: the child without resolving interpolations (model.vocab_size loads the tokenizer).
        if sub is not None and dataclasses.is_dataclass(sub) and isinstance(node._get_node(key), DictConfig):
            problems += _unknown_keys(node._get_node(key), sub, f"{full}.")
    return problems


def validate(cfg) -> None:
    """Raise one ConfigError listing every problem found."""
    cluster = cluster_problems(cfg)
    problems = (
        unknown_key_problems(cfg)
        + experiment_problems()
        + run_name_problems(cfg)
        + model_problems(cfg)
        + cluster
        # The world size (nodes x devices) underlies the parallel and batch checks.
        + (parallel_problems(cfg) if not cluster else [])
        + slurm_problems(cfg)
        + data_problems(cfg)
        + trainer_problems(cfg)
        + precision_problems(cfg)
        + guard_problems(cfg)
        + hardware_problems(cfg)
        + tokenizer_problems(cfg)
        + special_token_problems(cfg)
        + missing_extra_problems(cfg)
        + wandb_problems(cfg)
        + checkpoint_problems(cfg)
        + finetune.problems(cfg)
        + preference.problems(cfg)
        + input_safety.problems(cfg)
    )
    raise_if_any(problems)

"""Semantic checks on a composed config, all reported together before anything is built.

Hydra and the schemas already rejected unknown keys and wrong types; these are the problems
that need more than one key to see (tp vs heads, batch arithmetic, paths that must exist).
"""

from __future__ import annotations

import os
from pathlib import Path

from tinytrain.cluster.sbatch import sbatch_problems
from tinytrain.cluster.slurm import allocation_problems, current_task
from tinytrain.config.schema import DataFormat, DataSource, Mode, Strategy
from tinytrain.data.chat_templates import template_problems
from tinytrain.data.tokenizer import check_tokenizer_path, load_from_config
from tinytrain.errors import ConfigError, Problem, raise_if_any
from tinytrain.plan import hardware as hw_table
from tinytrain.plan.layout import batch_layout, devices_per_node, world_size


def model_problems(cfg) -> list[Problem]:
    m, tp = cfg.model, cfg.parallel.tp
    problems = []
    if m.hidden_size % m.num_heads:
        problems.append(Problem("model.num_heads", m.num_heads, f"must divide hidden_size({m.hidden_size})", "pick a head count that divides the hidden size"))
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
    if m.pretrained and not (Path(m.pretrained) / "config.json").is_file():
        problems.append(Problem("model.pretrained", m.pretrained, "no config.json there", "point model.pretrained at a local Hugging Face model folder (save_pretrained output)"))
    return problems


def parallel_problems(cfg) -> list[Problem]:
    par = cfg.parallel
    if par.tp > 1 and par.strategy != Strategy.fsdp_tp:
        # Batch arithmetic depends on tp, so it is checked once tp is possible at all.
        fix = "use parallel.tp=1, or parallel=fsdp_tp for tensor parallelism"
        return [Problem("parallel.tp", par.tp, f"parallel={par.name} has no tensor parallelism", fix)]
    problems = []
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
    return problems


RECORD_SOURCES = (DataSource.jsonl, DataSource.parquet, DataSource.hf)
SOURCE_SUFFIX = {DataSource.text: ".txt", DataSource.jsonl: ".jsonl", DataSource.parquet: ".parquet"}


def data_problems(cfg) -> list[Problem]:
    d = cfg.data
    problems = []
    if d.seq_len < 2:
        problems.append(Problem("data.seq_len", d.seq_len, "must be >= 2", "use e.g. data.seq_len=256"))
    max_pos = cfg.model.max_position_embeddings
    if not cfg.model.pretrained and d.seq_len > max_pos:
        problems.append(Problem("data.seq_len", d.seq_len, f"longer than model.max_position_embeddings({max_pos})", f"use data.seq_len<={max_pos} or raise model.max_position_embeddings"))
    if d.val_path is None and not 0.0 < d.val_fraction < 1.0:
        problems.append(Problem("data.val_fraction", d.val_fraction, "must be between 0 and 1", "use e.g. data.val_fraction=0.05, or a separate data.val_path"))
    sft = d.format != DataFormat.text
    if sft and d.source not in RECORD_SOURCES:
        problems.append(Problem("data.format", d.format.value, f"SFT records come from jsonl, parquet or hf sources, not data.source={d.source.value}", "set data.source=jsonl (or parquet, hf)"))
    if d.store and sft:
        problems.append(Problem("data.store", d.store, f"a token store holds pretraining text, but data.format={d.format.value} (SFT data is tokenized at the start of each run)", "remove data.store"))
    elif d.store and not (Path(d.store) / "meta.json").is_file():
        problems.append(Problem("data.store", d.store, "not a token store (no meta.json there)", "point it at a store folder printed by mode=prepare, or remove data.store to use the cache"))
    elif not d.store:
        problems += source_path_problems(d.source, d.path, "data.path")
    if d.val_path is not None:
        problems += source_path_problems(d.source, d.val_path, "data.val_path")
    for key in ("num_workers", "tokenize_workers"):
        value = getattr(d, key)
        if value is not None and value < 0:
            problems.append(Problem(f"data.{key}", value, "must be >= 0", "use 0 to work in the training process"))
    if d.pad_to_multiple_of < 1:
        problems.append(Problem("data.pad_to_multiple_of", d.pad_to_multiple_of, "must be >= 1", "use 8 (the default) or 1 for no rounding"))
    return problems + chat_template_problems(cfg)


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
    suffix = SOURCE_SUFFIX[source]
    fix = f"point {key} at a readable file or a folder of {suffix} files"
    if not p.exists():
        return [Problem(key, path, "no such file or folder", fix)]
    listed = [p] if p.is_file() else sorted(p.rglob(f"*{suffix}"))
    if not listed:
        return [Problem(key, path, f"folder holds no {suffix} files", fix)]
    unreadable = [f for f in listed if not os.access(f, os.R_OK)]
    if unreadable:
        return [Problem(key, path, f"not readable: {unreadable[0]}", fix)]
    return []


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
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        problems.append(Problem("trainer.min_lr_ratio", t.min_lr_ratio, "must be between 0 and 1", "use e.g. 0.1"))
    if len(t.betas) != 2:
        problems.append(Problem("trainer.betas", list(t.betas), "needs two values", "use e.g. trainer.betas=[0.9,0.95]"))
    return problems


def hardware_problems(cfg) -> list[Problem]:
    name = cfg.hardware.gpu
    if name and hw_table.lookup_gpu(name) is None:
        return [Problem("hardware.gpu", name, "unknown GPU", f"use one of {', '.join(hw_table.known_gpu_names())}")]
    return []


def checkpoint_problems(cfg) -> list[Problem]:
    problems = []
    path = cfg.checkpoint.init_from
    if path and not Path(path).is_file():
        problems.append(Problem("checkpoint.init_from", path, "no such checkpoint file", "point it at a .ckpt file from a tinytrain run's checkpoints/ folder"))
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
    """Keys added with `+key=value` that no schema declares (Hydra lets `+` add anything)."""
    import dataclasses

    from tinytrain.config.schema import Config

    known = {f.name for f in dataclasses.fields(Config)}
    return [
        Problem(key, cfg[key], "is not a tinytrain config key", f"remove it; top-level keys are {', '.join(sorted(known))}")
        for key in cfg
        if key not in known
    ]


def validate(cfg) -> None:
    """Raise one ConfigError listing every problem found."""
    problems = (
        unknown_key_problems(cfg)
        + model_problems(cfg)
        + parallel_problems(cfg)
        + slurm_problems(cfg)
        + data_problems(cfg)
        + trainer_problems(cfg)
        + hardware_problems(cfg)
        + tokenizer_problems(cfg)
        + checkpoint_problems(cfg)
    )
    raise_if_any(problems)

"""Entry point: `python -m tinytrain key=value ...` wires the stages and nothing else.

compose (Hydra) -> validate -> resolve -> [mode=prepare: build the data and stop] -> plan
-> [mode=sbatch: write the Slurm job script] -> build + fit (mode=train only).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from tinytrain.config.resolvers import register_resolvers
from tinytrain import run_lock
from tinytrain.config.schema import PLANNING_MODES, Mode, Strategy, register_schemas
from tinytrain.errors import ConfigError, Problem

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
log = logging.getLogger("tinytrain")


def is_rank_zero() -> bool:
    # Set by torchrun / Lightning's DDP launcher / srun before this process starts.
    for var in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if var in os.environ:
            return int(os.environ[var]) == 0
    return True


def run_stages(cfg: DictConfig, run_dir: Path) -> dict:
    from tinytrain.fast_paths import liger_installed, select_fast_paths
    from tinytrain.model import choose_attention, flash_attn_installed
    from tinytrain.model_shape import parameter_count, shape_from_config
    from tinytrain.plan import build_plan, memory_section, render_plan, write_plan
    from tinytrain.resolve import resolve
    from tinytrain.tokenizer import load_from_config
    from tinytrain.validate import validate

    from tinytrain.output_modes import OUTPUT_MODES

    if cfg.mode in OUTPUT_MODES:
        # The model, tokenizer and template are the checkpoint's run's, not this command line's.
        from tinytrain import output_modes

        return output_modes.run(cfg, run_dir, data_overridden())
    validate(cfg)
    if cfg.mode in PLANNING_MODES and is_rank_zero():
        refuse_trained_directory(run_dir)
    tokenizer = load_from_config(cfg.tokenizer)
    from tinytrain.bos_policy import resolve_add_bos

    # One BOS policy for the token store, SFT samples and the export (config_resolved.yaml records it).
    add_bos, add_bos_reason = resolve_add_bos(cfg.tokenizer, cfg.data, tokenizer)
    cfg.tokenizer.add_bos = cfg.data.prepend_bos = add_bos
    resolved = resolve(cfg, tokenizer)
    if cfg.mode == Mode.prepare:
        return prepare_data(cfg, tokenizer, resolved)
    attention = choose_attention(cfg.model.attention, flash_attn_installed(), resolved.hardware)
    if cfg.model.pretrained:
        from tinytrain.model import pretrained_config
        from tinytrain.model_shape import shape_from_hf

        model_config = pretrained_config(cfg.model.pretrained)
        saved_vocab = model_config.vocab_size  # what preflight checks the weights against
        model_config.vocab_size = resolved.vocab.padded
        shape = shape_from_hf(model_config)
    else:
        # The transformers config is built only to train: importing its modeling code would
        # double the time of a plan.
        model_config, saved_vocab = None, None
        shape = shape_from_config(cfg.model, resolved.vocab.padded)
    params = parameter_count(shape)
    deepspeed = None
    if cfg.parallel.strategy == Strategy.deepspeed:
        from tinytrain import deepspeed_config

        deepspeed = deepspeed_config.build(cfg.parallel, resolved.batch, resolved.precision, cfg.trainer.grad_clip)
    init_from = None
    if cfg.checkpoint.init_from:
        from tinytrain.checkpoint import check_compatible, read

        init_from = check_compatible(read(cfg.checkpoint.init_from), cfg.checkpoint.init_from, resolved.vocab, resolved.tokenizer_fingerprint, cfg.checkpoint.allow_tokenizer_change)
    resume = resume_point(cfg, run_dir, resolved)
    preflight, untrained, fix = run_preflight(cfg, tokenizer, resolved, model_config, saved_vocab)
    memory = memory_section(cfg, resolved, shape, params, attention)
    fast = select_fast_paths(cfg.trainer, cfg.parallel.strategy, not resolved.hardware.is_cpu, resolved.vocab.padded, liger_installed(), cfg.parallel.zero_stage)
    plan = build_plan(cfg, resolved, params, attention, cfg.model.name, memory, deepspeed)
    plan["tokenizer"].update(add_bos=add_bos, add_bos_reason=add_bos_reason)
    plan["fast_paths"] = fast.to_dict()
    plan["preflight"] = {"findings": preflight, "untrained_rows": [r.describe() for r in untrained], "fix": fix or None}
    plan["init_from"] = init_from and {"path": cfg.checkpoint.init_from, **init_from}
    plan["resume"] = resume and resume.to_dict()
    if is_rank_zero():
        run_dir.mkdir(parents=True, exist_ok=True)
        write_plan(plan, run_dir)
        if deepspeed is not None:
            (run_dir / "deepspeed_config.json").write_text(json.dumps(deepspeed, indent=2) + "\n")
        (run_dir / "config_resolved.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        print(render_plan(plan), flush=True)
    if cfg.mode in PLANNING_MODES:
        if is_rank_zero():
            print(f"plan written to {run_dir / 'plan.json'}")
        return {"plan": plan}

    from tinytrain.model import hf_config
    from tinytrain.train import fit

    if model_config is None:
        model_config = hf_config(cfg.model, resolved.vocab.padded, tokenizer)
    model_config.use_cache = False
    return fit(cfg, run_dir, tokenizer, resolved, model_config, attention, deepspeed, shape, fast, (untrained, fix), resume)


def data_overridden() -> bool:
    """Whether the command line names data (mode=eval then evaluates on it, not on the run's)."""
    from hydra.core.hydra_config import HydraConfig

    return any(o.lstrip("+~").startswith("data") for o in HydraConfig.get().overrides.task)


def checkpoint_shorthand(args: list[str]) -> list[str]:
    """`checkpoint=<path>` is short for checkpoint.path=<path> (`checkpoint` is a config node)."""
    return [f"checkpoint.path={a.removeprefix('checkpoint=')}" if a.startswith("checkpoint=") else a for a in args]


def refuse_trained_directory(run_dir: Path) -> None:
    """A plan written into a trained run's directory would replace the plan.json and
    config_resolved.yaml that describe its checkpoints."""
    from tinytrain.checkpoint_files import step_checkpoints

    checkpoints = run_dir / "checkpoints"
    trained = [p.name for _, p in step_checkpoints(checkpoints)] + [p.name for p in (checkpoints / "final.ckpt",) if p.exists()]
    if trained:
        raise ConfigError(
            Problem(
                "hydra.run.dir",
                str(run_dir),
                f"holds a trained run (checkpoints/{trained[0]}); a plan here would replace the plan.json and config_resolved.yaml that describe it",
                "plan into a new directory (run.name=<new>), or continue that run with mode=train (resume=auto)",
            )
        )


def resume_point(cfg: DictConfig, run_dir: Path, resolved):
    """The checkpoint this run continues from (tinytrain/resume.py), checked against this run;
    rank 0 of a training run also clears what interrupted saves left behind."""
    from tinytrain import resume

    checkpoints = run_dir / "checkpoints"
    point = resume.resolve_resume(cfg.resume, checkpoints, resolved.vocab, resolved.tokenizer_fingerprint, cfg.model.name)
    if cfg.mode != Mode.train or not is_rank_zero():
        return point
    for path in resume.leftover_temp_files(checkpoints):
        log.warning("removed %s: a checkpoint save that was interrupted (the previous checkpoint is intact)", path.relative_to(run_dir))
    for path in resume.set_aside(point.skipped if point else []):
        log.warning("renamed an unreadable checkpoint to %s", path.relative_to(run_dir))
    if point is not None:
        log.info("%s", point.describe(run_dir))
        if cfg.checkpoint.init_from:
            log.info("checkpoint.init_from=%s not applied: the run continues from its own checkpoint", cfg.checkpoint.init_from)
    return point


def run_preflight(cfg, tokenizer, resolved, pretrained_hf_config, saved_vocab: int | None):
    """Findings (raises on errors), untrained rows found in pretrained weights, and the fix to apply."""
    from tinytrain import preflight
    from tinytrain.embedding_health import candidate_token_ids, find_untrained, pretrained_tables

    findings = preflight.special_token_findings(cfg, tokenizer, resolved.vocab.padded)
    tables = {}
    if cfg.model.pretrained:
        tables = pretrained_tables(cfg.model.pretrained)
        rows = tables["input embeddings"].shape[0] if "input embeddings" in tables else None
        findings += preflight.pretrained_findings(cfg, tokenizer, pretrained_hf_config, saved_vocab, rows)
    untrained, fix = [], ""
    if tables:
        candidates = candidate_token_ids(tokenizer, cfg.tokenizer.add_special_tokens)
        untrained = find_untrained(tables, candidates, min(len(tokenizer), min(t.shape[0] for t in tables.values())))
        used = {tokenizer.convert_tokens_to_ids(t) for t in cfg.tokenizer.add_special_tokens} | {tokenizer.eos_token_id}
        found, fix = preflight.untrained_findings(cfg, untrained, used)
        findings += found
    unfixed = [] if fix else untrained
    findings += preflight.precision_findings(cfg, resolved.precision.value, unfixed, packed=False)
    return preflight.report(findings), untrained, fix


def prepare_data(cfg: DictConfig, tokenizer, resolved) -> dict:
    """Build what training reads (the token store; SFT samples are tokenized and counted) and stop."""
    from tinytrain.data.datamodule import DataModule

    data = DataModule(cfg.data, tokenizer, resolved.batch.micro_batch_size, cfg.seed, progress=is_rank_zero(), data_parallel=resolved.batch.data_parallel)
    if is_rank_zero():
        print(data.describe(), flush=True)
    return {"data": data}


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def hydra_main(cfg: DictConfig):
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from tinytrain.errors import PREEMPTED_EXIT_CODE, Preempted, TrainingStopped

    # A multirun job on a cluster (hydra/launcher=submitit_slurm) starts here in a fresh process,
    # without main(): the resolvers the config refers to are registered again.
    register_resolvers()
    hydra_cfg = HydraConfig.get()
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    if multirun:
        name_multirun_job(cfg, hydra_cfg.job.num)
    try:
        # Rank 0 holds the run directory for the run's life; other ranks run under it.
        with run_lock.hold(run_dir, cfg.mode.value) if is_rank_zero() else contextlib.nullcontext():
            result = run_stages(cfg, run_dir)
            if cfg.mode == Mode.sbatch:
                from tinytrain import sbatch

                path = sbatch.write(cfg, list(hydra_cfg.overrides.task), run_dir)
                print(f"Slurm job written to {path}; submit it with:\n  sbatch {path}")
    except (ConfigError, TrainingStopped) as e:
        if os.environ.get("TINYTRAIN_TRACEBACK") == "1":
            raise
        message = e.render() + "\n(set HYDRA_FULL_ERROR=1 for the traceback)" if isinstance(e, ConfigError) else str(e)
        print(message, file=sys.stderr)
        if multirun:
            # Hydra marks the job failed and runs the next one; after the last job the sweeper
            # raises the first failure again and main() exits with its code.
            raise
        sys.exit(2 if isinstance(e, ConfigError) else 3)
    except Preempted as e:
        if is_rank_zero():
            print(str(e), file=sys.stderr)
        sys.exit(PREEMPTED_EXIT_CODE)
    # Hydra multirun sweepers optimise the task's return value.
    return result.get("val_loss")


def name_multirun_job(cfg: DictConfig, job_num: int) -> None:
    """The jobs of one multirun share run.name (the sweep's); in wandb they are the sweep's group
    and each is named after its job number, unless the user named them."""
    if cfg.logger.wandb_group is None:
        cfg.logger.wandb_group = cfg.run.name
    if cfg.logger.wandb_name is None:
        cfg.logger.wandb_name = f"{cfg.run.name}/{job_num}"


def main() -> None:
    from tinytrain.errors import TrainingStopped
    from tinytrain.friendly_errors import friendly_message

    register_resolvers()
    register_schemas()
    # Hydra prints a trimmed traceback for every error; tinytrain prints one paragraph naming
    # the key, the value and the fix instead. Users who want the traceback set HYDRA_FULL_ERROR=1
    # (remembered across the processes a DDP launcher starts).
    os.environ.setdefault("TINYTRAIN_TRACEBACK", os.environ.get("HYDRA_FULL_ERROR", "0"))
    os.environ["HYDRA_FULL_ERROR"] = "1"
    sys.argv = checkpoint_shorthand(sys.argv)
    try:
        hydra_main()
    except KeyboardInterrupt:
        # Ctrl-C before training (during training the first one saves a checkpoint and exits 75),
        # or a second Ctrl-C during training: what is on disk is complete (atomic saves).
        if os.environ["TINYTRAIN_TRACEBACK"] == "1":
            raise
        print("tinytrain: interrupted (Ctrl-C); checkpoints already on disk are complete, resume=auto continues from the newest", file=sys.stderr)
        sys.exit(130)
    except TrainingStopped as e:  # a multirun job's, raised again by the sweeper after the last job
        if os.environ["TINYTRAIN_TRACEBACK"] == "1":
            raise
        print(str(e), file=sys.stderr)
        sys.exit(3)
    except Exception as e:  # noqa: BLE001 - every exception is either explained or re-raised
        message = friendly_message(e, sys.argv[1:])
        if message is None or os.environ["TINYTRAIN_TRACEBACK"] == "1":
            raise
        print(message, file=sys.stderr)
        sys.exit(2)

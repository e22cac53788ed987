"""Build and fit: the data, the module and the trainer for a RunPlan; train; save the final
checkpoint; export and plot on rank 0.

Everything here runs after the plan, so configuration problems have already been reported.
"""

from __future__ import annotations

import logging
from pathlib import Path

from tinytrain.checkpoint.average import newest_step_checkpoints
from tinytrain.checkpoint.format import vocab_param_names
from tinytrain.cluster.rank_logging import say
from tinytrain.cluster.signal_memory import SignalMemory
from tinytrain.config.schema import Arch, UntrainedPolicy
from tinytrain.data.datamodule import DataModule
from tinytrain.data.reference_cache import ReferenceCache, model_source
from tinytrain.data.unpaired import UnpairedDataset
from tinytrain.errors import ConfigError, HangStopped, Problem, TrainingStopped
from tinytrain.model.activation_checkpointing import apply_checkpointing
from tinytrain.model.build import build_model, model_config
from tinytrain.model.compile import apply_compile
from tinytrain.model.fp8 import apply_fp8
from tinytrain.model.init_weights import weights_for_run
from tinytrain.model.liger import apply_kernels
from tinytrain.model.lora import apply_adapters, load_quantized_base
from tinytrain.model.module import CausalLMModule
from tinytrain.model.reference import FrozenReference
from tinytrain.model.zero3_layers import gather_layers_whole
from tinytrain.plan.run_plan import RunPlan
from tinytrain.preflight.checks import data_findings, report
from tinytrain.preflight.embedding_health import fix_rows, reinit_rows, vocab_tables
from tinytrain.train.callbacks.evals import eval_callback
from tinytrain.train.callbacks.preemption import Preemption
from tinytrain.train.callbacks.reference_logps import PrecomputeReference
from tinytrain.train.callbacks.samples import sample_callback
from tinytrain.train.callbacks.slurm_evals import slurm_eval_callback
from tinytrain.train.callbacks.step_tokens import step_tokens_callback
from tinytrain.train.callbacks.tokens_seen import TokensSeen
from tinytrain.train.metrics_csv import last_logged
from tinytrain.train.plot import plot_evals, plot_loss
from tinytrain.train.run_end import RunModel, average, export, export_dir_for
from tinytrain.train.trainer import build_trainer, end_wandb_run, quiet_lightning

log = logging.getLogger(__name__)


def build_module(cfg, plan: RunPlan, tokenizer):
    """The LightningModule for the plan. A resumed run gets neither checkpoint.init_from nor the
    untrained-row fix (Lightning loads the resume checkpoint over them), except under LoRA, whose
    frozen base is rebuilt as it was, and for a DPO/IPO reference copy (the initial weights, taken
    before Lightning loads the resumed policy); finetune=lora|qlora then adds the adapters."""
    if plan.finetune and plan.finetune.method == "qlora":
        model = load_quantized_base(cfg.model, plan.vocab.padded, plan.attention, compute_dtype(plan))
    else:
        model = build_model(cfg.model, model_config(cfg.model, plan.vocab.padded, tokenizer), plan.attention)
    # Under LoRA the base is rebuilt as it was even for a resume: ZeRO-3 restores only trainable
    # weights from its shards, and a frozen base must be the one the adapters were trained on.
    frozen_copy = plan.preference is not None and plan.preference.frozen_copy
    fresh = plan.resume is None or plan.finetune is not None or frozen_copy
    if plan.init_from and fresh:
        names = vocab_param_names(model)
        state = weights_for_run(plan.init_from, names, plan.vocab, tokenizer)
        model.load_state_dict(state, strict=True)
    if plan.pretrained_tokenizer and plan.pretrained_tokenizer.reinit_rows and fresh and not plan.init_from:
        # Another tokenizer than the model's: no row is reused by id (preflight/pretrained_tokenizer.py).
        reinit_rows(vocab_tables(model), true_vocab=plan.vocab.true, noisy=cfg.model.untrained_tokens == UntrainedPolicy.noisy_mean, seed=cfg.seed)
    elif plan.preflight.rows_to_fix and fresh:
        # The rows preflight found, rewritten on the weights this run trains (after any resize).
        fix_rows(vocab_tables(model), plan.preflight.rows_to_fix, true_vocab=plan.vocab.true, noisy=plan.preflight.fix == "noisy_mean", seed=cfg.seed)
    reference = None
    if frozen_copy:
        import copy

        reference = FrozenReference(copy.deepcopy(model))
    if plan.finetune:
        model = apply_adapters(model, plan.finetune, frozen_dtype(plan))
    fast = plan.fast_paths
    if fast.liger:
        apply_kernels(model, Arch(model.config.model_type))  # the built model's family (a pretrained one's own)
    if plan.fp8.enabled:
        log.info("float8 training: %d linear layers converted (%s)", apply_fp8(model, plan.fp8.emulate), plan.fp8.reason)
        if reference is not None:  # the reference computes as the policy does: step 0's rewards are 0, its loss ln 2
            apply_fp8(reference.model, plan.fp8.emulate)
    zero3 = plan.parallel.row.deepspeed and plan.parallel.zero_stage == 3
    if zero3:
        gather_layers_whole(model)
    apply_checkpointing(model, fast.activation_checkpointing, fast.checkpoint_every)
    apply_compile(model, fast.compile, fast.compile_backend, zero3=zero3)  # after checkpointing: it places each block's checkpoint (model/compile.py)
    return CausalLMModule.for_plan(model, cfg.trainer, plan, reference)


def compute_dtype(plan: RunPlan):
    return plan.precision.dtype.torch


def frozen_dtype(plan: RunPlan):
    """The dtype a LoRA run's frozen base is held in: the compute dtype under Lightning's mixed
    precision (autocast computes in it anyway); None (as loaded) for QLoRA's 4-bit base and under
    DeepSpeed, which casts the whole model itself."""
    if plan.parallel.row.deepspeed or plan.finetune.method == "qlora":
        return None
    return compute_dtype(plan)


def preference_layout_check(plan: RunPlan, data: DataModule) -> None:
    """kto trains on unpaired {prompt, completion, label} records and every other objective on pairs:
    the records read decide which (data/unpaired.py), so the two are compared once the data is built."""
    if plan.preference is None:
        return
    unpaired, kto = isinstance(data.train, UnpairedDataset), plan.preference.name == "kto"
    if unpaired and not kto:
        raise ConfigError(Problem("finetune.objective", plan.preference.name, "the records are unpaired {prompt, completion, label} (TRL's KTO layout), which only kto trains on", "set finetune.objective=kto, or give pairs {prompt, chosen, rejected}"))
    if kto and not unpaired:
        raise ConfigError(Problem("finetune.objective", "kto", "kto trains on unpaired {prompt, completion, label} records and these are pairs", "set finetune.objective=dpo (or ipo, simpo, orpo), or give TRL's unpaired layout"))


def fit(*, cfg, plan: RunPlan, run_dir: Path, tokenizer, data: DataModule, watched=None, signals: SignalMemory | None = None) -> dict:
    """Build the module and the trainer for the plan, train on `data` (the run's DataModule, built
    for the plan's batch), save the final checkpoint and (rank 0) export. A plan with a resume
    point continues from it. `watched`: this rank's hang watchdog (cluster/watched_rank.py), or None.
    `signals`: the handler the run installed before its plan (cli.run_stages)."""
    import lightning.pytorch as pl

    preemption = Preemption(run_dir, signals)
    preemption.install_early()  # a SIGUSR1 until training starts is honoured at the first step
    quiet_lightning()
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    log.info("%s", data.describe())
    report(data_findings(cfg, data.stores, plan.vocab.true))
    preference_layout_check(plan, data)
    precompute = reference_cache_callbacks(cfg, plan, data)
    module = build_module(cfg, plan, tokenizer)
    tokens_seen = TokensSeen(plan.batch.tokens_over)
    evals, slurm_evals = eval_callback(plan, run_dir, tokenizer, tokens_seen.at, watched), slurm_eval_callback(plan, cfg, run_dir)
    samples = sample_callback(cfg, plan, run_dir, tokenizer) + precompute + evals + slurm_evals
    step_tokens = step_tokens_callback(data.train_sampler, data.train, plan.preference)
    built = build_trainer(cfg, plan, run_dir, train_sampler=data.train_sampler, extra_callbacks=[tokens_seen, *step_tokens], at_validation_end=samples, validates_last_step=True, preemption=preemption, watched=watched)
    trainer, summary = built.trainer, built.summary
    resume = plan.resume
    final = run_dir / "checkpoints" / "final.ckpt"
    failed = True
    try:
        # Raises Preempted (callbacks/preemption.py) after a signal: no final checkpoint, no export.
        try:
            trainer.fit(module, train_dataloaders=data.train_dataloader(), val_dataloaders=data.val_dataloader(), ckpt_path=resume and str(resume.path))
        except SystemExit:
            # Lightning turns a KeyboardInterrupt (a second Ctrl-C, one while a checkpoint loads)
            # into exit(1) after its teardown: it is the user's interrupt (cli.main: exit 130).
            if trainer.interrupted:
                raise KeyboardInterrupt from None
            raise
        # Every rank takes part: each writes its shards (fsdp_tp, DeepSpeed), and an async save
        # in flight is finished first; the final one is written before the export reads it.
        trainer.save_checkpoint(final)
        wait_for_checkpoint = getattr(trainer.strategy, "wait_for_checkpoint", None)
        if wait_for_checkpoint is not None:
            wait_for_checkpoint()
        val_now = trainer.callback_metrics.get("val_loss")
        unusable = built.nonfinite.unusable_end(None if val_now is None else float(val_now), summary.last, trainer.global_step)
        # Every rank stops alike: without validation each judges its own last loss.
        if trainer.strategy.reduce_boolean_decision(unusable is not None, all=False):
            raise TrainingStopped(unusable or "tinytrain: training ended on weights whose last training loss was non-finite on another rank; nothing was exported")  # exit 3 before the export, the evals and the summary
        failed = False
    except Exception as e:
        if built.dead_rank.refusal is not None:
            raise ConfigError(built.dead_rank.refusal) from e
        dead = built.dead_rank.message
        if dead is None:
            raise
        raise (HangStopped if built.dead_rank.hang else TrainingStopped)(dead) from e  # one line instead of the collective's traceback
    finally:
        if watched is not None:
            watched.finish()  # a stop every rank agreed on (or the end): its watchdog does not act on it
        end_wandb_run(cfg, failed)
    val_loss, val_step = trainer.callback_metrics.get("val_loss"), trainer.global_step
    if val_loss is None:  # this process validated nothing (resumed at max_steps): the run's last
        val_loss, val_step = last_logged(run_dir / "metrics.csv", "val_loss")
    result = {
        "data_ran_out": built.mixture.message if built.mixture else None,
        "first_loss": summary.first,
        "last_loss": summary.last,
        "loss_means": summary.means(),  # (first, last) `loss_window` steps
        "loss_window": summary.window,
        "val_loss": float(val_loss) if val_loss is not None else None,
        "val_step": val_step if val_loss is not None else None,
        "profile": built.profiler.summary() if built.profiler else None,
        "evals": evals[0].summary() if evals else None,
        "eval_jobs": None,
        "stragglers": built.stragglers.summary() if built.stragglers else None,
        **built.throughput.summary(),
    }
    if slurm_evals and trainer.is_global_zero:
        slurm_evals[0].submit_final(trainer.global_step)  # final.ckpt is on disk: its job may start
        result["eval_jobs"] = slurm_evals[0].summary()
    if trainer.is_global_zero:
        finish(cfg, plan, run_dir=run_dir, final_checkpoint=final, tokenizer=tokenizer, result=result)
    return result


def reference_cache_callbacks(cfg, plan: RunPlan, data) -> list:
    """finetune.precompute_reference: the cached log-probs attached to the pairs, or the callback
    that computes them at fit start (a fresh run: its initial weights are the reference)."""
    if plan.preference is None or not plan.preference.precomputed:
        return []
    cache = ReferenceCache.for_run(
        cfg.data.cache_dir,
        train=data.train,
        val=data.val,
        tokenizer_fingerprint=plan.tokenizer_fingerprint,
        source=model_source(cfg.model, cfg.checkpoint.init_from, cfg.seed),
        precision=plan.precision.lightning + (f", float8{' (emulated)' if plan.fp8.emulate else ''}" if plan.fp8.enabled else ""),
        attention=plan.attention.implementation,
        rows_fixed=plan.preflight.rows_to_fix,
    )
    loaded = cache.load_into(data.train, data.val)
    if loaded:
        log.info("reference log-probs reused from %s (no reference forward)", cache.path)
    elif plan.resume is not None:
        raise ConfigError(
            Problem(
                "finetune.precompute_reference",
                True,
                f"this run resumes from step {plan.resume.step}, but the reference log-probs it started with ({cache.path}) are gone or do not read (the log says which), and the resumed weights are no longer the reference",
                "restore that file (or data.cache_dir), or start the run afresh in a new run directory",
            )
        )
    return [PrecomputeReference(cache, train=data.train, val=data.val, collate=data.collate, micro_batch_size=plan.batch.micro_batch_size, loaded=loaded)]


def average_at_the_end(cfg, plan: RunPlan, run_dir: Path, tokenizer) -> None:
    """checkpoint.average_last=k: the mean of the run's newest k step checkpoints, beside them,
    exported to hf_export-average-k<k>-<newest> (checkpoint/average.py)."""
    paths = newest_step_checkpoints(run_dir, cfg.checkpoint.average_last)
    if len(paths) < 2:
        log.warning("checkpoint.average_last=%d: the run saved %d step checkpoint(s), nothing to average", cfg.checkpoint.average_last, len(paths))
        return
    out = average(paths, run_dir / "checkpoints")
    export_dir = export_dir_for(out, run_dir)
    if cfg.trainer.export:
        export(out, RunModel(model_config(cfg.model, plan.vocab.padded, tokenizer), tokenizer, plan.vocab.true, plan.export), export_dir)
    say(f"averaged the last {len(paths)} step checkpoints ({', '.join(p.name for p in paths)}) -> {out}{' and ' + str(export_dir) if cfg.trainer.export else ''}")


def finish(cfg, plan: RunPlan, *, run_dir: Path, final_checkpoint: Path, tokenizer, result: dict) -> None:
    if cfg.trainer.plot and (run_dir / "metrics.csv").exists():
        objective = plan.preference.name if plan.preference else None
        plot_loss(run_dir / "metrics.csv", run_dir / "loss_curve.png", f"{cfg.model.name} on {cfg.data.name}", f"{objective} loss" if objective else "cross-entropy (nats/token)")
    if cfg.trainer.plot:
        plot_evals(run_dir / "evals.csv", run_dir / "evals.png", f"{cfg.model.name}: downstream tasks")
    if cfg.trainer.export:
        model = RunModel(model_config(cfg.model, plan.vocab.padded, tokenizer), tokenizer, plan.vocab.true, plan.export, plan.finetune and plan.finetune.to_dict())
        # fsdp_tp's shards stream, one tensor at a time; a DeepSpeed run's folder of partitions is
        # consolidated once and kept (final.consolidated.ckpt).
        export(final_checkpoint, model, Path(cfg.export.dir or export_dir_for(final_checkpoint, run_dir)), keep_at=final_checkpoint.with_suffix(".consolidated.ckpt"))
    if cfg.checkpoint.average_last:
        average_at_the_end(cfg, plan, run_dir, tokenizer)
    if result["data_ran_out"]:
        say(result["data_ran_out"])
    val = f", validation {result['val_loss']:.4f} (step {result['val_step']})" if result["val_loss"] is not None else ""
    if result["first_loss"] is None:  # resumed from a checkpoint at trainer.max_steps, or where the data ran out
        why = "the mixture source above ran out" if result["data_ran_out"] else f"trainer.max_steps={plan.max_steps}"
        say(f"no step left to train ({why}){val}")
    else:
        # A resumed run's process saw its own steps only (metrics.csv holds the whole run's).
        since = f" since the resume at step {plan.resume.step}" if plan.resume else ""
        say(f"loss {result['first_loss']:.4f} (first step{since}) -> {result['last_loss']:.4f} (last step){val}")
        first, last = result["loss_means"]
        k = result["loss_window"]
        say(f"loss mean of the first {k} step(s){since} {first:.4f} -> of the last {k} {last:.4f} (one batch's loss is noisy: compare these)")
    if result["tokens_per_s_per_device"]:
        mfu = f"MFU {100 * result['mfu']:.1f}% of the {result['note']}" if result["mfu"] is not None else result["note"]
        left = ", ".join(f"{n} {why}" for why, n in result["left_out"].items() if n)
        say(f"throughput {result['tokens_per_s_per_device']:,.0f} tokens/s per device after the first step{f' (steps left out: {left})' if left else ''}; {mfu}")
    if result["profile"]:
        say(result["profile"])
    if result["eval_jobs"]:
        say(result["eval_jobs"])
    if result["evals"]:
        ev = result["evals"]
        share = f", {100 * ev['eval_share']:.1f}% of the run's training time" if ev["eval_share"] is not None else ""
        failed = f"; failed at step(s) {', '.join(map(str, ev['eval_failed']))} (the warnings say why)" if ev["eval_failed"] else ""
        say(f"evals: {ev['eval_scorings']} scoring(s) of {', '.join(plan.evals.tasks)} took {ev['eval_seconds']:.1f} s{share}{failed} -> {run_dir / 'evals.csv'}")
    if result["stragglers"]:
        say(result["stragglers"])
    say(f"run directory: {run_dir}")

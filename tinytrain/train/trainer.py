"""The Lightning Trainer a run uses: strategy and precision from the plan, tinytrain's callbacks
(throughput, guards, data position, RNG state, preemption, step checkpoints) and loggers."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import NamedTuple

from tinytrain.cluster.slurm import current_task
from tinytrain.config.schema import Exhaustion
from tinytrain.plan.run_plan import RunPlan
from tinytrain.train.atomic_io import AtomicCheckpointIO
from tinytrain.train.callbacks.accumulation_change import AccumulationChange
from tinytrain.train.callbacks.context_parallel import ContextParallel
from tinytrain.train.callbacks.data_position import DataPosition
from tinytrain.train.callbacks.dead_rank import DeadRank
from tinytrain.train.callbacks.final_validation import FinalValidation
from tinytrain.train.callbacks.grad_spike import GradSpikeMonitor
from tinytrain.train.callbacks.heartbeat import Heartbeat
from tinytrain.train.callbacks.loss_scale_guard import LossScaleGuard
from tinytrain.train.callbacks.loss_summary import LossSummary
from tinytrain.train.callbacks.mixture_exhaustion import MixtureExhaustion
from tinytrain.train.callbacks.nonfinite_guard import NonFiniteGuard
from tinytrain.train.callbacks.preemption import Preemption, SaveAfterValidation
from tinytrain.train.callbacks.profiler import Profiler
from tinytrain.train.callbacks.progress_lines import ProgressLines, bar_on_terminal
from tinytrain.train.callbacks.rng_state import RNGState
from tinytrain.train.callbacks.step_checkpoints import StepCheckpoints
from tinytrain.train.callbacks.stragglers import Stragglers
from tinytrain.train.callbacks.throughput import ThroughputMonitor, peak_tflops
from tinytrain.train.health_check import HealthCheck
from tinytrain.train.metrics_csv import ResumableCSVLogger
from tinytrain.train.strategy import build_trainer_hardware

log = logging.getLogger(__name__)


def cluster_plugins() -> list:
    """Under Slurm: Lightning's SLURMEnvironment with auto_requeue off. Its requeue handler saves a
    checkpoint inside the signal handler, in the middle of a step; callbacks/preemption.py saves at
    the next step boundary instead."""
    if current_task() is None:  # SLURMEnvironment.detect(), without its warning
        return []
    from lightning.fabric.plugins.environments import SLURMEnvironment

    return [SLURMEnvironment(auto_requeue=False)]


def quiet_lightning() -> None:
    """Keep Lightning's own console lines once (not again through Hydra's root handler) and drop
    notices that are not about this run."""
    import warnings

    lightning_log = logging.getLogger("lightning.pytorch")
    lightning_log.propagate = False
    for handler in lightning_log.handlers:  # handler filters also see records of child loggers
        handler.addFilter(lambda record: "Tip:" not in record.getMessage())
    # The CSV logger shares the run directory with plan.json and the resolved config on purpose.
    warnings.filterwarnings("ignore", message=r"Experiment logs directory .* exists and is not empty")
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    # fsdp_tp: the loss slices the gathered logits out of place, which is what FSDP2 asks for.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    logging.getLogger("torch.distributed.tensor._redistribute").setLevel(logging.ERROR)
    # Lightning only knows resumable loaders by their state_dict; tinytrain's sampler position is
    # restored by the DataPosition callback instead, so a mid-epoch resume is exact.
    warnings.filterwarnings("ignore", message=r"You're resuming from a checkpoint that ended before the epoch ended")
    # DeepSpeed: tinytrain clips through DeepSpeed's config and measures there (module.py), and
    # DeepSpeed 0.19 still calls torch.distributed's deprecated collectives.
    warnings.filterwarnings("ignore", message=r"Since DeepSpeed handles gradient clipping internally")
    warnings.filterwarnings("ignore", message=r"`torch.distributed.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated")
    logging.getLogger("compilers").setLevel(logging.WARNING)  # DeepSpeed's op builder probing for libaio with gcc
    # torchao's and DeepSpeed's import-time notices: cluster/library_notices.py (every mode, every rank).


def guard_callbacks(cfg, plan: RunPlan, run_dir: Path) -> list:
    """The loss-scale guard (and the loss_scale metric) exist only where fp16 loss scaling does;
    it names the untrained rows preflight was told to leave alone."""
    g = cfg.guard
    policy = plan.precision.loss_scale
    pref = plan.preference
    loss_settings = f"finetune.objective={pref.name} finetune.beta={pref.beta:g} finetune.label_smoothing={pref.label_smoothing:g} finetune.simpo_gamma={pref.simpo_gamma:g}" if pref else None
    nonfinite = NonFiniteGuard(g.nonfinite.value, g.max_consecutive_skips, run_dir / "checkpoints", loss_settings, compiled=plan.fast_paths.compile != "none")
    loss_scale = [LossScaleGuard(g.loss_scale_halvings, policy, plan.preflight.unfixed_rows, nonfinite)] if policy else []
    return [
        nonfinite,
        *loss_scale,
        GradSpikeMonitor(g.grad_spike_factor, g.grad_spike_warmup, run_dir / "grad_spikes.jsonl"),
    ]


def extra_loggers(cfg, plan: RunPlan, run_dir: Path) -> list:
    """Next to metrics.csv: wandb (with the resolved config and the plan attached) and TensorBoard,
    each when asked for (imported only then)."""
    loggers = []
    if cfg.logger.wandb:
        loggers.append(wandb_logger(cfg, plan, run_dir))
    if cfg.logger.tensorboard:
        from lightning.pytorch.loggers import TensorBoardLogger

        # <run dir>/tensorboard/: a resumed run adds an event file beside the first one's, and purges
        # the earlier files' events of the steps it trains again (TensorBoard showed them twice).
        # Lightning logs optimizer step k at k - 1: the resumed step's own rows stay.
        purge = {"purge_step": plan.resume.step} if plan.resume else {}
        loggers.append(TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version="", default_hp_metric=False, **purge))
    return loggers


def wandb_logger(cfg, plan: RunPlan, run_dir: Path):
    from lightning.pytorch.loggers import WandbLogger

    lg = cfg.logger
    config = {**plan.resolved_config(cfg), "plan": plan.to_dict()}
    return WandbLogger(
        project=lg.wandb_project,
        entity=lg.wandb_entity,
        group=lg.wandb_group,
        tags=list(lg.wandb_tags),
        name=lg.wandb_name or cfg.run.name,
        save_dir=str(run_dir),
        config=config,
        # One wandb run per run directory: a resumed (requeued) run continues its history. A wandb
        # sweep agent names the run it started in WANDB_RUN_ID; that id must be kept.
        id=os.environ.get("WANDB_RUN_ID") or wandb_run_id(cfg.run.name, run_dir),
        resume="allow",
    )


def end_wandb_run(cfg, failed: bool) -> None:
    """A local multirun trains its jobs in one process, and Lightning's WandbLogger logs into a
    wandb run that is still open: each job's run ends with the job."""
    if not cfg.logger.wandb:
        return
    import wandb

    if wandb.run is not None:
        wandb.finish(exit_code=1 if failed else 0)


WANDB_ID_FILE = "wandb_run_id"


def wandb_run_id(run_name: str, run_dir: Path) -> str:
    """The run directory's wandb id: kept in it (`wandb_run_id`), so a resumed or requeued run
    continues its wandb run, while a new run in a directory of the same name (the old one
    deleted) starts its own. It was the name and a hash of the path: a second `run.name=debug`
    appended its history to the first's. The first rank to write it wins; the others read it."""
    import re
    import secrets
    import time

    path = run_dir / WANDB_ID_FILE
    mine = earlier_wandb_id(run_dir) or f"{re.sub(r'[^A-Za-z0-9_-]', '-', run_name)[:48]}-{secrets.token_hex(4)}"
    try:
        with open(path, "x") as f:  # exclusive: one writer
            f.write(mine + "\n")
        return mine
    except FileExistsError:
        for _ in range(50):  # another rank created it a moment ago and is writing it
            if text := path.read_text().strip():
                return text
            time.sleep(0.1)
        return mine


def earlier_wandb_id(run_dir: Path) -> str | None:
    """The wandb run of a directory an older tinytrain trained in, before it kept its id there:
    wandb's own folder of it, `wandb/[offline-]run-<YYYYMMDD_HHMMSS>-<id>` (the newest). Without
    it, resuming such a run started a second wandb run, silently."""
    import re

    found = sorted((m.group(1), m.group(2)) for d in (run_dir / "wandb").glob("*run-*") if (m := re.fullmatch(r"(?:offline-)?run-(\d{8}_\d{6})-(.+)", d.name)))
    return found[-1][1] if found else None


def mixture_callback(plan: RunPlan, train_sampler) -> MixtureExhaustion | None:
    """data.exhaustion=stop over a mixture: the callback that ends the run before a source repeats."""
    mixture = plan.mixture
    if not (mixture and mixture.exhaustion == Exhaustion.stop.value and train_sampler is not None):
        return None
    keys = [f"data.sources[{i}].path" for i in range(len(mixture.sources))]
    return MixtureExhaustion(train_sampler, keys, plan.batch.accumulate_grad_batches)


def rank_zero_where_no_launcher() -> None:
    """Lightning reads its rank-0 switch (what logs metrics.csv and the curve) from LOCAL_RANK,
    RANK or SLURM_PROCID alone, as it is imported: one of them stray in the user's shell made a
    single run skip its metrics, silently. tinytrain reads them only beside their launcher's
    companion variable (cluster/rank_logging.py); where no launcher started this process, it is
    rank 0 (Lightning's launcher sets each rank it starts itself)."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from tinytrain.cluster.rank_logging import launcher_rank

    if launcher_rank() is None:
        rank_zero_only.rank = 0


class BuiltTrainer(NamedTuple):
    """The trainer, and the callbacks whose findings are the run's result (fit reads them here)."""

    trainer: object
    throughput: ThroughputMonitor
    summary: LossSummary
    dead_rank: DeadRank  # why a rank's collective failed, when one did
    mixture: MixtureExhaustion | None  # data.exhaustion=stop over a mixture: which source ran out
    profiler: Profiler | None  # trainer.profile
    stragglers: Stragglers | None  # cluster.straggler_*: the ranks named slow
    nonfinite: NonFiniteGuard  # whether the run ended on weights gone non-finite


def build_trainer(cfg, plan: RunPlan, run_dir: Path, *, train_sampler=None, extra_callbacks=(), at_validation_end=(), validates_last_step=False, preemption=None, watched=None) -> BuiltTrainer:
    """The Lightning Trainer every tinytrain run uses (benchmarks/step_overhead.py times this one).
    A resumed run's metrics.csv keeps the rows before the step it resumes from. `watched`: this
    rank's cluster.watched_rank.WatchedRank, when the hang watchdog is on. `at_validation_end`:
    callbacks whose work there (sample generations) is left out of the throughput, as validation is.
    `validates_last_step`: the run has validation data, and validates at its last step too
    (callbacks/final_validation.py)."""
    import lightning.pytorch as pl

    rank_zero_where_no_launcher()
    t = cfg.trainer
    b = plan.batch
    hw = build_trainer_hardware(plan)
    summary = LossSummary()
    cp = plan.parallel.cp
    val_every = t.val_every_n_steps if t.val_batches else 0  # 0: the run does not validate
    last_validated = plan.max_steps if validates_last_step and val_every else 0
    profiler = Profiler(run_dir / "profile", start=t.profile_start, steps=t.profile_steps, memory_estimate=plan.memory.to_dict()) if t.profile else None
    throughput = ThroughputMonitor(plan.shape, *peak_tflops(plan.hardware, plan.precision.dtype), ranks_per_batch=plan.parallel.tp * cp, profiled=profiler.traces if profiler else None)
    bar = bar_on_terminal(t.progress_bar)
    dead_rank = DeadRank(run_dir)
    mixture = mixture_callback(plan, train_sampler)
    stragglers = Stragglers(plan.stragglers.every_n_steps, plan.stragglers.threshold) if plan.stragglers and plan.stragglers.enabled else None
    guards = guard_callbacks(cfg, plan, run_dir)
    preemption = preemption or Preemption(run_dir)
    callbacks = [
        *([HealthCheck(plan.health.budget_s, plan.health.on_bad_node, plan.hardware)] if plan.health and plan.health.enabled else []),
        # First: a batch's beat is written before any other callback's work on it.
        *([Heartbeat(watched, compiling=plan.fast_paths.compile != "none")] if watched is not None else []),
        *([ContextParallel(cp, b.micro_batch_size, plan.context.kind, plan.parallel.tp)] if cp > 1 else []),
        # Before the samples and evals: a stop at a validating step saves as soon as it is logged.
        SaveAfterValidation(preemption),
        # Before the throughput monitor: it closes validation's pause at validation's end.
        *at_validation_end,
        throughput,
        *([stragglers] if stragglers else []),
        *([ProgressLines(t.log_every_n_steps, plan.max_steps)] if t.progress_bar and not bar else []),
        summary,
        *guards,
        *([DataPosition(train_sampler, context_parallel=cp)] if train_sampler is not None else []),
        AccumulationChange(b.accumulate_grad_batches, train_sampler),
        # After DataPosition: it looks ahead from the position that counts this step's batches.
        *([mixture] if mixture else []),
        RNGState(cfg.seed),
        *([FinalValidation(plan.max_steps, val_every)] if last_validated else []),
        dead_rank,
        # After DataPosition: a checkpoint it saves has counted the step's batch.
        preemption,
        # Checkpoint callbacks run last (Lightning orders them so).
        StepCheckpoints(run_dir / "checkpoints", t.checkpoint_every_n_steps, cfg.checkpoint.keep_last, val_every, last_validated),
        *extra_callbacks,
        *([profiler] if profiler else []),
    ]
    plugins = [*cluster_plugins(), AtomicCheckpointIO(), *([hw.precision_plugin] if hw.precision_plugin else [])]
    trainer = pl.Trainer(
        accelerator=hw.accelerator,
        devices=hw.devices,
        num_nodes=hw.num_nodes,
        strategy=hw.strategy,
        precision=None if hw.precision_plugin else hw.precision,
        plugins=plugins,
        max_steps=plan.max_steps,
        accumulate_grad_batches=b.accumulate_grad_batches,
        val_check_interval=t.val_every_n_steps * b.accumulate_grad_batches,
        check_val_every_n_epoch=None,
        limit_val_batches=t.val_batches,
        num_sanity_val_steps=0,
        # A run shorter than the interval still logs (its last step): metrics.csv is always written.
        log_every_n_steps=min(t.log_every_n_steps, plan.max_steps),
        logger=[ResumableCSVLogger(run_dir, plan.resume and plan.resume.step, plan.stage), *extra_loggers(cfg, plan, run_dir)],
        callbacks=callbacks,
        enable_progress_bar=bar,
        enable_model_summary=False,
        default_root_dir=str(run_dir),
        # The batch sampler shards by data-parallel rank itself (DataPosition.setup), resumably.
        use_distributed_sampler=False,
    )
    nonfinite = next(g for g in guards if isinstance(g, NonFiniteGuard))
    return BuiltTrainer(trainer, throughput, summary, dead_rank, mixture, profiler, stragglers, nonfinite)

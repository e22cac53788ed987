"""Entry point: `python -m tinytrain key=value ...` wires the stages and nothing else.

compose (Hydra) -> validate -> [mode=prepare: build the data and stop] -> plan (resolve, start
points, preflight: one RunPlan) -> [mode=plan / sbatch: write the plan (and the Slurm job
script) and stop] -> build + fit -> save (mode=train).
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

from tinytrain.checkpoint import run_lock
from tinytrain.cluster import console_handler, library_notices, process_group, rank_logging, sweep_results
from tinytrain.cluster.import_gc import collector_paused, release_finished_job
from tinytrain.cluster.overrides import hydra_overrides, names_data, script_overrides, task_overrides
from tinytrain.config import CONF_DIR, run_mode
from tinytrain.config.checks import removed_key_problems
from tinytrain.config.resolvers import PLACEHOLDER_GIVEN, is_placeholder, register_resolvers, remember_found
from tinytrain.config.schema import PLANNING_MODES, Mode, register_schemas
from tinytrain.errors import ConfigError, Problem, again_in
from tinytrain.outputs import unused_run_dir

log = logging.getLogger("tinytrain")


def is_rank_zero() -> bool:
    return rank_logging.process_rank() == 0


def run_stages(cfg: DictConfig, run_dir: Path):
    """The stages in order; each call is one stage. Returns what the mode produced: the data
    (prepare), the RunPlan (plan, sbatch), the training result (train) or an output mode's
    (export, generate, eval)."""
    with collector_paused():
        from tinytrain.data.bos_policy import decide_bos
        from tinytrain.data.run_data import RunData, step_keys
        from tinytrain.data.tokenizer import load_from_config
        from tinytrain.outputs import modes
        from tinytrain.plan.planner import make_plan
        from tinytrain.plan.pretrained_shape import adopt as adopt_pretrained_shape
        from tinytrain.plan.pretrained_shape import given_model_keys
        from tinytrain.plan.validate import validate

    if cfg.mode in modes.MODES:
        # The model, tokenizer and template are the checkpoint's run's, not this command line's.
        return modes.run(cfg, run_dir, names_data())
    signals = None
    if cfg.mode == Mode.train:
        from tinytrain.cluster.signal_memory import SignalMemory

        # Slurm's SIGUSR1 reaches every rank whenever it comes, and by default kills: from here on it
        # is remembered and honoured at the first step boundary (train/callbacks/preemption.py).
        signals = SignalMemory()
        signals.install_early()
    adopt_pretrained_shape(cfg, given_model_keys())  # model.pretrained's shape, not the preset's
    validate(cfg)
    if cfg.mode in PLANNING_MODES and is_rank_zero():
        refuse_trained_directory(run_dir, cfg.mode)
    tokenizer = load_from_config(cfg.tokenizer)
    # One BOS decision for the token store, SFT samples and the export (the plan carries it).
    bos = decide_bos(cfg, tokenizer)
    data = RunData(cfg.data, tokenizer, bos, seed=cfg.seed, progress=is_rank_zero(), step_keys=step_keys(cfg.trainer))
    if cfg.mode == Mode.prepare:
        return prepare_data(cfg, data)
    plan = make_plan(cfg, tokenizer, run_dir, bos=bos, data=data)
    # After planning the plan is the source: a stage writing into the config fails here, loudly.
    OmegaConf.set_readonly(cfg, True)
    if is_rank_zero():
        write_plan_files(cfg, plan, run_dir)
        rank_logging.say(plan.render())
    if cfg.mode in PLANNING_MODES:
        if is_rank_zero():
            rank_logging.say(f"plan written to {run_dir / 'plan.json'}")
        return plan
    if is_rank_zero():
        clean_up_after_interrupted_saves(cfg, plan, run_dir)

    with collector_paused():
        from tinytrain.cluster import extension_locks
        from tinytrain.train.fit import fit

    extension_locks.clear_stale()  # before DeepSpeed builds an op: a lock a killed build left would stall it for ever
    watched = watch(plan, run_dir)
    try:
        # Data first: bad data is reported before weights are allocated (a mixture's was built to plan).
        if watched is not None:
            watched.beat(phase="data")
        built = data.build(plan.batch)
        if watched is not None:
            watched.beat(phase="startup")
        return fit(cfg=cfg, plan=plan, run_dir=run_dir, tokenizer=tokenizer, data=built, watched=watched, signals=signals)
    finally:
        if watched is not None:
            watched.finish()  # however this ends (an error in the data, a multirun's next job in this process)


def watch(plan, run_dir: Path):
    """This rank's hang watchdog (cluster/watchdog.py), from before the data build until training ends."""
    if plan.watchdog is None or not plan.watchdog.enabled:
        return None
    from tinytrain.cluster.heartbeat import global_rank
    from tinytrain.cluster.watched_rank import WatchedRank

    return WatchedRank(run_dir, global_rank(plan.cluster.devices_per_node), plan.world_size, plan.watchdog.limits())


def write_plan_files(cfg: DictConfig, plan, run_dir: Path) -> None:
    """plan.json, config_resolved.yaml and deepspeed_config.json: views of the one plan."""
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "plan.json").write_text(json.dumps(plan.to_dict(), indent=2) + "\n")
    (run_dir / "config_resolved.yaml").write_text(OmegaConf.to_yaml(plan.resolved_config(cfg)))
    if plan.deepspeed is not None:
        (run_dir / "deepspeed_config.json").write_text(json.dumps(plan.deepspeed, indent=2) + "\n")


def checkpoint_shorthand(args: list[str]) -> list[str]:
    """`checkpoint=<path>` is short for checkpoint.path=<path> (`checkpoint` is a config node), and
    `checkpoints=[...]` for checkpoint.average=[...]."""
    shorthands = {"checkpoint=": "checkpoint.path=", "checkpoints=": "checkpoint.average="}
    return [next((full + a.removeprefix(short) for short, full in shorthands.items() if a.startswith(short)), a) for a in args]


def refuse_trained_directory(run_dir: Path, mode: Mode = Mode.plan) -> None:
    """A plan written into a trained run's directory would replace the plan.json and
    config_resolved.yaml that describe its checkpoints. The fix plans a new directory that resumes
    from its newest checkpoint (the plan shows the resume line), or continues the run itself: mode=sbatch
    by resubmitting the job script it wrote there."""
    from tinytrain.checkpoint.files import step_checkpoints
    from tinytrain.cluster.sbatch import SCRIPT_NAME

    checkpoints = run_dir / "checkpoints"
    trained = [p.name for _, p in step_checkpoints(checkpoints)] + [p.name for p in (checkpoints / "final.ckpt",) if p.exists()]
    if not trained:
        return
    # run.name places the directory unless hydra.run.dir was given itself
    new = "hydra.run.dir=<new directory>" if any(o.startswith("hydra.run.dir=") for o in hydra_overrides()) else "run.name=<new>"
    resumed = f"{new} resume={checkpoints / trained[0]}"
    script = run_dir / SCRIPT_NAME
    if mode == Mode.sbatch and script.exists():
        fix = f"resubmit the job script written there, which continues that run (resume=auto): sbatch {script}; or write a job for a new directory that resumes from its newest checkpoint: {resumed}"
    elif mode == Mode.sbatch:
        fix = f"write a job for a new directory that resumes from its newest checkpoint: {resumed}; or continue that run with mode=train (resume=auto)"
    else:
        fix = f"plan a new directory that resumes from its newest checkpoint: {resumed} (the plan shows its resume line); or continue that run with mode=train (resume=auto)"
    raise ConfigError(Problem("hydra.run.dir", str(run_dir), f"holds a trained run (checkpoints/{trained[0]}); mode={mode.value} here would replace the plan.json and config_resolved.yaml that describe it", fix))


def clean_up_after_interrupted_saves(cfg: DictConfig, plan, run_dir: Path) -> None:
    """Rank 0 of a training run: remove what killed saves left, set aside checkpoints that did
    not load (resume=auto skipped them), and say where the run continues from."""
    from tinytrain.checkpoint import resume

    for path in resume.leftover_temp_files(run_dir / "checkpoints"):
        log.warning("removed %s: a checkpoint save that was interrupted (the previous checkpoint is intact)", path.relative_to(run_dir))
    point = plan.resume
    for path in resume.set_aside(point.skipped if point else []):
        log.warning("renamed an unreadable checkpoint to %s", path.relative_to(run_dir))
    if point is not None:
        log.info("%s", point.describe(run_dir))
        if cfg.checkpoint.init_from:
            log.info("checkpoint.init_from=%s not applied: the run continues from its own checkpoint", cfg.checkpoint.init_from)


def prepare_data(cfg: DictConfig, data):
    """mode=prepare: build the data, say what was built, and stop. With data.prepare_part: that part
    of the token store only (a Slurm array task), and the store's manifest if it was the last."""
    if cfg.data.prepare_part is not None:
        from tinytrain.data import parts
        from tinytrain.data.sources import Source

        lines = parts.prepare_one(Source.from_config(data.settings), data.settings, data.tokenizer)
        rank_logging.say("\n".join(f"data       {line}" for line in lines))
        return lines
    from tinytrain.plan.layout import world_size
    from tinytrain.plan.parallel import unplanned_batch

    batch = unplanned_batch(cfg, world_size(cfg))  # what training will draw (no plan is made)
    built = data.build(batch)
    if is_rank_zero():
        rank_logging.say(built.describe())
    return built


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def hydra_main(cfg: DictConfig):
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf.errors import InterpolationResolutionError

    from tinytrain.config.friendly_errors import friendly_message
    from tinytrain.errors import HANG_EXIT_CODE, PREEMPTED_EXIT_CODE, HangStopped, Preempted, TrainingStopped

    # A multirun job on a cluster (hydra/launcher=submitit_slurm) starts here in a fresh process,
    # without main(): the resolvers the config refers to are registered again.
    register_resolvers()
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.job.chdir:
        # Every output is written into the run directory by its full path; relative inputs
        # (data.path, data.cache_dir's shared token stores, a tokenizer folder) are read from where
        # the command ran, as without it. Hydra returns to that folder after the job either way.
        os.chdir(hydra_cfg.runtime.cwd)
    run_dir = Path(hydra_cfg.runtime.output_dir)
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    rank = None  # until read: a rank variable that is no number is refused as a bad key is
    ended_cleanly = False  # finished, or refused before any work; a crash keeps its directory and log
    was_refused = False  # a hydra.run.dir given on the command line is removed only then (unused_run_dir)
    # A process refused the lock leaves the directory to its holder (who may have made it just now).
    locking = held = False
    try:
        rank = rank_logging.process_rank()
        rank_logging.configure(rank)
        library_notices.quiet()
        problems = removed_key_problems(cfg) + (local_multirun_ranks_problems(cfg, hydra_cfg) if multirun else [])
        if problems:
            raise ConfigError(problems)
        if multirun:
            name_multirun_job(cfg, hydra_cfg.job.num)
        if is_placeholder(cfg.run.name):  # a launcher's rank given hydra.run.dir: named by it (wandb too)
            cfg.run.name = run_dir.name
        # Rank 0 holds the run directory for the run's life; other ranks run under it.
        locking = True
        with run_lock.hold(run_dir, cfg.mode.value) if rank == 0 else contextlib.nullcontext():
            held = True
            if multirun and rank == 0 and cfg.mode == Mode.train:  # its directory may hold another job's run
                sweep_results.claim(run_dir, task_overrides(), str(OmegaConf.select(hydra_cfg, "sweep.subdir", default="")), Path(hydra_cfg.sweep.dir))
            result = run_stages(cfg, run_dir)
            process_group.release()
            if cfg.mode == Mode.sbatch:
                from tinytrain.cluster import sbatch

                path = sbatch.write(cfg, script_overrides(), run_dir, host_peak_bytes=result.host.peak_bytes if result.host else None)
                if cfg.data.prepare_parts > 1:
                    from tinytrain.cluster import prepare_array

                    submit = prepare_array.write(cfg, script_overrides(), run_dir)
                    print(f"Slurm jobs written: {run_dir / prepare_array.PREPARE_NAME} (the token store, {cfg.data.prepare_parts} parts as an array) and {path} (training, after every part); submit both with:\n  bash {submit}")
                else:
                    print(f"Slurm job written to {path}; submit it with:\n  sbatch {path}")
                if result.hardware.is_cpu:
                    # The job asks for GPUs; precision, memory and --mem were planned for this machine.
                    print(f"note: planned for {result.hardware.name} (no GPU here, no hardware.gpu): name the job's GPU (hardware.gpu=A800) so its precision, memory and host memory are planned for it")
        ended_cleanly = True
    except (ConfigError, TrainingStopped, InterpolationResolutionError) as e:
        refused = not isinstance(e, TrainingStopped)  # a bad key or value, or a ${...} that does not resolve
        ended_cleanly = refused
        was_refused = refused
        if os.environ.get("TINYTRAIN_TRACEBACK") == "1":
            raise
        # As main() words it: a ConfigError (also one a resolver raised inside a ${...}), or the ${...}.
        message = friendly_message(e, sys.argv[1:]) if refused else str(e)
        if rank in (0, None):  # every rank of a DDP run reaches the same guard decision: say it once
            rank_logging.say(message, logging.ERROR)  # in tinytrain.log too: why the run stopped
        if multirun:
            # Hydra marks the job failed and runs the next one; after the last job the sweeper
            # raises the first failure again and main() exits with its code.
            forget_job(e)
            raise
        sys.exit(2 if refused else HANG_EXIT_CODE if isinstance(e, HangStopped) else 3)
    except Preempted as e:
        if rank == 0:
            rank_logging.say(str(e), logging.WARNING)
        sys.exit(PREEMPTED_EXIT_CODE)
    except BrokenPipeError:
        reader_left()  # here, before Hydra prints "Error executing job ..." for it
    except Exception as e:
        if multirun:
            forget_job(e)
        raise
    finally:
        # A multirun's job directories are the sweep's record; rank None: refused for its rank variable.
        # Where rank 0 was refused the lock, the directory is its holder's.
        if ended_cleanly and not multirun and rank in (0, None) and (held or not locking):
            unused_run_dir.remove_if_unused(run_dir, refused=was_refused)
        if multirun:
            release_finished_job()
    # Hydra multirun sweepers optimise the task's return value: a training's final validation
    # loss, an eval's loss (a multirun of mode=eval over checkpoints ranks them).
    if not isinstance(result, dict):
        return None
    return result.get("loss") if cfg.mode == Mode.eval else result.get("val_loss")


def local_multirun_ranks_problems(cfg: DictConfig, hydra_cfg) -> list[Problem]:
    """Jobs of a local multirun run one after another in this process; Lightning's launcher starts
    the other ranks of a job with this process's whole command line (-m and every swept value), so
    rank 1 ran a multirun of its own: it took job 1's directory and the real job 1 was refused."""
    from tinytrain.plan.layout import world_size

    launcher = str(OmegaConf.select(hydra_cfg, "launcher._target_", default=""))
    if cfg.mode != Mode.train or not launcher.endswith("BasicLauncher") or world_size(cfg) <= 1:
        return []
    return [Problem("cluster.devices", cfg.cluster.devices, f"gives each job of a local multirun {world_size(cfg)} ranks, which Lightning's launcher would start with the whole multirun's command line", "run each combination as its own command (a shell loop over the values), or launch the multirun on the cluster with hydra/launcher=submitit_slurm")]


def forget_job(e: BaseException) -> None:
    """A failed multirun job's exception is kept by Hydra until the sweep ends (the first is raised
    again then): its traceback's frames held the job's module, trainer and data (on a GPU its memory)
    through every later job. Their locals are cleared; the traceback's lines stay."""
    import traceback

    seen: set[int] = set()
    while e is not None and id(e) not in seen:  # the exceptions it was raised from hold frames too
        seen.add(id(e))
        traceback.clear_frames(e.__traceback__)
        e = e.__cause__ or e.__context__


def name_multirun_job(cfg: DictConfig, job_num: int) -> None:
    """The jobs of one multirun share run.name (the sweep's); in wandb they are the sweep's group
    and each is named after its job number, unless the user named them."""
    if cfg.logger.wandb_group is None:
        cfg.logger.wandb_group = cfg.run.name
    if cfg.logger.wandb_name is None:
        cfg.logger.wandb_name = f"{cfg.run.name}/{job_num}"


def reader_left() -> None:
    """stdout's reader went away (`tinytrain mode=plan | head`): not a disk error, nothing to
    explain. Exit as a process killed by SIGPIPE does, with nothing more written to the pipe."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    sys.exit(128 + 13)


def composed_run_dir() -> Path | None:
    """The run directory Hydra composed for this command, where it got that far."""
    from hydra.core.hydra_config import HydraConfig

    try:
        return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None
    except Exception:  # noqa: BLE001 - only a hint for the message
        return None


def main() -> None:
    """The `tinytrain` command (and `python -m tinytrain`)."""
    from tinytrain.config.friendly_errors import causes, friendly_message
    from tinytrain.errors import TrainingStopped

    if "--version" in sys.argv[1:]:  # Hydra's own --version prints Hydra's
        import tinytrain

        print(f"tinytrain {tinytrain.__version__}")
        return
    register_resolvers()
    register_schemas()
    if {"--help", "-h"} & set(sys.argv[1:]):  # Hydra's lists its ConfigStore's internal nodes; --hydra-help stays Hydra's
        from tinytrain.config import help

        try:
            print(help.render(help.default_config()))
        except BrokenPipeError:
            reader_left()
        return
    # Hydra prints a trimmed traceback for every error; tinytrain prints one paragraph naming
    # the key, the value and the fix instead. Users who want the traceback set HYDRA_FULL_ERROR=1
    # (remembered across the processes a DDP launcher starts).
    os.environ.setdefault("TINYTRAIN_TRACEBACK", os.environ.get("HYDRA_FULL_ERROR", "0"))
    os.environ["HYDRA_FULL_ERROR"] = "1"
    sys.argv = checkpoint_shorthand(sys.argv)
    given_run_dir = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("hydra.run.dir=")]
    if given_run_dir and "${" not in given_run_dir[-1]:  # as tt.run_dir records the default one
        remember_found(given_run_dir[-1].strip("\"'"), given=True)  # Lightning's launcher quotes it
    console_handler.quiet_for_printing_flags(sys.argv[1:])
    PLACEHOLDER_GIVEN.clear()  # this command's defaults, not an earlier one's in this process (tests)
    try:
        with run_mode.composed_once(sys.argv[1:]):
            hydra_main()
    except KeyboardInterrupt:
        # Ctrl-C before training (during training the first one saves a checkpoint and exits 75),
        # or a second Ctrl-C during training: what is on disk is complete (atomic saves). The ranks
        # Lightning started got it too and exit 130 first: its observer would SIGKILL this process
        # (-9, 137 in a shell) before it exits.
        from tinytrain.cluster.watched_rank import hold_off_lightning_observer

        hold_off_lightning_observer()
        if os.environ["TINYTRAIN_TRACEBACK"] == "1":
            raise
        run_dir = composed_run_dir()
        then = f"{again_in(run_dir)}: resume=auto continues from the newest" if run_dir and (run_dir / "checkpoints").is_dir() else "resume=auto continues from the newest"
        print(f"tinytrain: interrupted (Ctrl-C); checkpoints already on disk are complete; {then}", file=sys.stderr)
        sys.exit(130)
    except TrainingStopped as e:  # a multirun job's, raised again by the sweeper after the last job
        if os.environ["TINYTRAIN_TRACEBACK"] == "1":
            raise
        print(str(e), file=sys.stderr)
        sys.exit(3)
    except Exception as e:  # noqa: BLE001 - every exception is either explained or re-raised
        if any(isinstance(err, BrokenPipeError) for err in causes(e)):
            reader_left()
        message = friendly_message(e, sys.argv[1:])
        if message is None or os.environ["TINYTRAIN_TRACEBACK"] == "1":
            raise
        print(message, file=sys.stderr)
        sys.exit(2)

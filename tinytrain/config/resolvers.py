"""OmegaConf resolvers, registered before Hydra composes: paths of bundled assets, what the
Slurm environment says (tasks per node, the run name of a job), the run directory (refused
before Hydra creates it when run.name would escape run.root) and whether Hydra records the
composition there (never over a trained run's record). Values tinytrain derives (vocab,
precision) are not resolvers: the plan decides each once (tinytrain/plan/run_plan.py)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

from tinytrain.cluster.trained_run import holds_checkpoints
from tinytrain.errors import ConfigError, Problem

ASSETS = Path(__file__).resolve().parent.parent / "assets"


def _asset(name: str) -> str:
    return str(ASSETS / name)


def _slurm_tasks_per_node(default: int) -> int:
    from tinytrain.cluster.slurm import tasks_per_node

    return tasks_per_node(default)


def _run_name() -> str:
    """run.name's default. Every srun task evaluates this itself: a timestamp could differ between
    tasks of one job, and a requeued job must find its own directory again. The ranks Lightning's
    launcher starts are given rank 0's directory; other launchers' ranks are not (below)."""
    from datetime import datetime

    from tinytrain.cluster import slurm

    named = slurm.run_name()
    if named:
        return named
    if started_by_a_launcher():
        PLACEHOLDER_GIVEN.add(LAUNCHED_UNNAMED)
        return LAUNCHED_UNNAMED  # refused where it would name the directory (_run_dir)
    # Milliseconds: launches started together (a shell loop's `&`) each get their own directory,
    # where one second's name gave them one, whose record the refused ones wrote over.
    now = datetime.now()
    return f"{now:%Y-%m-%d_%H-%M-%S}.{now.microsecond // 1000:03d}"


# run.name's default in a rank a launcher started (torchrun, DeepSpeed's, a pod's RANK and
# WORLD_SIZE): a timestamp each rank made itself put ranks apart into different directories.
# Refused as the directory's name; harmless where the command gives hydra.run.dir itself, as
# Lightning's launcher does for the ranks it starts.
LAUNCHED_UNNAMED = "unnamed"
PLACEHOLDER_GIVEN: set[str] = set()  # holds it once this process's default was the placeholder


def is_placeholder(name: str) -> bool:
    """run.name is the launcher rank's placeholder, not a user's run.name=unnamed."""
    return str(name) == LAUNCHED_UNNAMED and LAUNCHED_UNNAMED in PLACEHOLDER_GIVEN


def started_by_a_launcher() -> bool:
    import os

    from tinytrain.cluster.rank_logging import launcher_rank

    world = os.environ.get("WORLD_SIZE", "1")
    return launcher_rank() is not None and world.isdigit() and int(world) > 1


# Each run directory as this process first resolved it -> whether it existed then (before Hydra
# created it): a directory this command made and left unused is removed (cli.py, outputs/unused_run_dir.py).
FOUND_BEFORE: dict[str, bool] = {}


def _run_dir(root: str, name: str) -> str:
    """hydra.run.dir: Hydra creates it before tinytrain runs, so a run.name that would escape
    run.root (`..`, slashes) is refused here, before anything is written."""
    problem = run_name_problem(str(name))
    if problem:
        raise ConfigError(problem)
    if is_placeholder(name):
        raise ConfigError(Problem("run.name", "(the default, a timestamp)", "would be made by every rank the launcher (torchrun, a pod's RANK and WORLD_SIZE) starts, from the time it starts: ranks apart would train into different directories", "give the run a name, the same on every node: run.name=<name> (the same command then resumes it)"))
    if str(root).startswith("~"):
        from tinytrain.config.checks import home_fix

        raise ConfigError(Problem("run.root", str(root), "starts with '~', which nothing expands here: the runs would go to a folder named '~' in the current one", home_fix("run.root", str(root))))
    path = f"{root}/{name}"
    remember_found(path)
    return path


# The hydra.run.dir the command line gave: an output mode's own log there is kept (Slurm's eval
# jobs give one per checkpoint); only a refused command removes it where it made it.
GIVEN_RUN_DIRS: set[str] = set()


def remember_found(path: str, given: bool = False) -> None:
    """Whether the run directory (and which of its parents) existed as this process first saw it,
    before Hydra creates it: for tt.run_dir, and for a hydra.run.dir given on the command line."""
    key = str(Path(path).resolve())
    if given:
        GIVEN_RUN_DIRS.add(key)
    if key not in FOUND_BEFORE:
        FOUND_BEFORE[key] = Path(path).exists()
        missing = [p for p in Path(key).parents if not p.exists()]
        if missing:
            MADE_ABOVE[key] = missing[-1]


# Each run directory -> the topmost of its parents Hydra creates with it (run.root on first use, a
# run.name's sub-folders): removed with an unused run directory where left empty.
MADE_ABOVE: dict[str, Path] = {}


LOCK_NAME = ".tinytrain.lock"  # the run directory's lock (checkpoint/run_lock.py)


def holder_line(what: str) -> str:
    """Who holds the run directory's lock, as its holder writes it there (checkpoint/run_lock.py)
    and running_here reads it (HOLDER)."""
    import os
    import socket
    import time

    return f"tinytrain mode={what}, pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"


HOLDER = r"pid (\d+) on (\S+), since"  # the pid and host of holder_line


def _hydra_record(mode: str, run_dir: str) -> str | None:
    """hydra.output_subdir: `.hydra`, the record of how the run was composed, except where another
    mode (a plan, an export, an eval) would write it over a trained run's record, or any process
    over the record of a run still running there (run_lock refuses it, after Hydra wrote): Hydra
    writes it before tinytrain runs. None: Hydra writes no record."""
    if (str(mode) != "train" and holds_checkpoints(Path(run_dir))) or running_here(Path(run_dir)):
        return None
    return ".hydra"


def _log_file(run_dir: str) -> str:
    """hydra.job_logging's file: <run dir>/tinytrain.log, except for a rank-0 process launched into
    a directory whose run is still running here (run_lock refuses it): its refusal would be
    appended to that run's log. Other ranks of the running run log there (rank_logging.py)."""
    from tinytrain.cluster.rank_logging import process_rank

    try:
        rank = process_rank()
    except ConfigError:  # a rank variable that is no number: refused by cli.hydra_main, which removes the directory
        rank = None
    if rank in (0, None) and running_here(Path(run_dir)):
        import os

        return os.devnull
    return str(Path(run_dir) / "tinytrain.log")


def running_here(run_dir: Path) -> bool:
    """Whether the holder the run directory's lock file names is a live process on this machine
    (not this one): read, not locked, since a probe's own flock could make the holder's fail. A
    holder on another machine is not seen; a dead one's line stays in the file after it ends."""
    import os
    import re
    import socket

    from tinytrain.cluster.local_process import running

    try:
        named = re.search(HOLDER, (run_dir / LOCK_NAME).read_text())
    except OSError:
        return False
    if not named or named.group(2) != socket.gethostname() or int(named.group(1)) == os.getpid():
        return False
    pid = int(named.group(1))
    if not running(pid):
        return False
    try:  # a killed holder's pid taken by another program since
        return b"tinytrain" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True


def run_name_problem(name: str) -> Problem | None:
    """The run directory is ${run.root}/${run.name}: run.name may hold sub-folders (a wandb sweep's
    sweep-<id>/<run id>) but must stay under run.root. validate reports it with the other
    problems; the resolver of hydra.run.dir first, before Hydra creates the directory."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts or name.startswith(("/", "~")) or ".." in parts:
        return Problem(
            "run.name",
            name,
            "must name a folder under run.root (not empty, not absolute, no '..'): the run directory is ${run.root}/${run.name}",
            "use a plain name like run.name=my_run, and run.root=<folder> to put runs elsewhere",
        )
    return None


def register_resolvers() -> None:
    for name, fn in {
        "tt.asset": _asset,
        "tt.slurm_tasks_per_node": _slurm_tasks_per_node,
        "tt.run_dir": _run_dir,
        "tt.hydra_record": _hydra_record,
        "tt.log_file": _log_file,
    }.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    if not OmegaConf.has_resolver("tt.run_name"):
        # Cached like Hydra's `now`: one name per process, however often run.name is read.
        OmegaConf.register_new_resolver("tt.run_name", _run_name, use_cache=True)

"""Logging for many processes: rank 0 logs to the console and to <run dir>/tinytrain.log; every
other rank only its warnings and errors, to both, each line prefixed with its rank.

Without this, every rank of a Slurm job (srun starts the same command N times) logs each line
N times, into the console and into the same tinytrain.log.
"""

from __future__ import annotations

import logging
import os
import sys

# Set by torchrun (RANK), srun (SLURM_PROCID) and Lightning's DDP launcher (LOCAL_RANK, in the
# processes it starts), each beside the variable its launcher always sets with it. One alone is a
# stray in the user's shell (`export LOCAL_RANK=$SLURM_LOCALID` outside srun): read as this
# process's rank it made tinytrain act as rank 1 (no plan.json, no metrics.csv, no lock) while
# Lightning trained as rank 0.
RANK_VARIABLES = (("RANK", "WORLD_SIZE"), ("SLURM_PROCID", "SLURM_NTASKS"), ("LOCAL_RANK", "WORLD_SIZE"))


def process_rank(env=os.environ) -> int:
    said = launcher_rank(env)
    return said[1] if said else 0


def launcher_rank(env=os.environ) -> tuple[str, int] | None:
    """(the variable, the rank) of the first of RANK_VARIABLES set beside its companion; None where
    none is. Not srun's inside an interactive allocation (`srun --pty bash`, salloc): Lightning's
    launcher starts the ranks there, and each inherits the shell's SLURM_PROCID=0."""
    from tinytrain.cluster.slurm import interactive

    for var, companion in RANK_VARIABLES:
        if var in env and companion in env and not (var == "SLURM_PROCID" and interactive(env)):
            return var, rank_value(var, env[var])
    return None


def rank_value(var: str, value: str) -> int:
    if not value.strip().isdigit():
        from tinytrain.errors import ConfigError, Problem

        raise ConfigError(Problem(var, value, "is not a rank (a whole number from 0), yet its launcher's companion variable is set", f"unset {var} where no launcher starts this process (srun, torchrun, Lightning set it themselves)"))
    return int(value)


def configure(rank: int) -> None:
    """Applied to the handlers Hydra's job logging set up (console and file on the root logger)."""
    if rank == 0:
        return
    prefix = logging.Formatter(f"[rank {rank}] [%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.WARNING)
        handler.setFormatter(prefix)
    # Python warnings of these ranks become log records, so they carry the rank too.
    logging.captureWarnings(True)


def say(text: str, level: int = logging.INFO) -> None:
    """Print what the user reads (the plan, the run's summary; at WARNING or above, why it stopped,
    on stderr) and keep it in tinytrain.log too: the log is what a run directory keeps of a run
    whose console went elsewhere (a Slurm job's file)."""
    print(text, flush=True, file=sys.stderr if level >= logging.WARNING else sys.stdout)
    record = logging.LogRecord("tinytrain", level, __file__, 0, text, None, None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)

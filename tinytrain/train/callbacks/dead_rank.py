"""A rank that dies outright (SIGKILL, the OOM killer) leaves rank 0 with a gloo / NCCL error from
inside a collective, a traceback that does not say what happened. Rank 0 started the other local
ranks (Lightning's subprocess launcher), so it can see which one died: it says so in one line,
with how to resume, and the run exits 3 like any other stop (cli.py).

Ranks started by someone else (srun, torchrun, another node) cannot be watched: a rank whose
collective fails because its peer went away says that in one line instead, and where to look.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import lightning.pytorch as pl

from tinytrain.checkpoint.files import step_checkpoints
from tinytrain.cluster.watched_rank import hold_off_lightning_observer
from tinytrain.errors import HANG_EXIT_CODE, ConfigError, Preempted, Problem, TrainingStopped, again_in

OWN_STOPS = (Preempted, TrainingStopped, ConfigError, KeyboardInterrupt)


class DeadRank(pl.Callback):
    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.message: str | None = None
        self.hang = False  # the rank that ended was stopped by the hang watchdog: this one exits as it did
        self.refusal: Problem | None = None  # the rendezvous port was taken: exit 2, as for a bad value
        self.given_port = os.environ.get("MASTER_PORT")  # the user's, before Lightning sets one

    def on_exception(self, trainer, pl_module, exception):
        if isinstance(exception, OWN_STOPS):
            return  # a stop every rank agreed on (another rank may have exited 75 or 3 first)
        procs = getattr(getattr(trainer.strategy, "launcher", None), "procs", None) or []
        if address_in_use(exception) and not rendezvous_done():  # before the ranks met: no peer was lost
            from lightning.fabric.plugins.environments import SLURMEnvironment

            self.refusal = port_taken(self.given_port, isinstance(getattr(trainer.strategy, "cluster_environment", None), SLURMEnvironment))
            hold_off_lightning_observer()  # it would SIGKILL this process for the ranks ended here
            for proc in procs:
                proc.kill()  # the ranks it started would wait for a rendezvous that never opens
            return
        dead = died(procs)
        if not dead:
            if trainer.world_size > 1 and lost_a_peer(exception):
                self.message = (
                    f"tinytrain: rank {trainer.global_rank} lost its connection to another rank during step {trainer.global_step + 1} "
                    f"({type(exception).__name__}: {first_line(exception)}): that rank stopped first (killed, out of memory, its node lost, or its own error); "
                    f"its log says which (under Slurm, `sacct -j <job id>` names the failed task). Once that is fixed, {again_in(self.run_dir)}: {self.resume_hint()}."
                )
            return
        hold_off_lightning_observer()  # its SIGKILL would come within 5 s; the message needs them
        rank, proc = dead
        then = self.resume_hint()
        step = trainer.global_step + 1
        if proc.returncode == HANG_EXIT_CODE:  # its watchdog stopped it a moment before this rank's did
            self.hang = True
            self.message = (
                f"tinytrain: rank {rank} (pid {proc.pid}) was stopped by the hang watchdog during step {step} (exit {HANG_EXIT_CODE}); "
                f"{self.run_dir / 'hang_report.txt'} says which rank did not arrive. {again_in(self.run_dir, sentence=True)}: {then}."
            )
        elif proc.returncode < 0:  # killed from outside (OOM killer, kill -9): rerunning is the fix
            self.message = (
                f"tinytrain: rank {rank} (pid {proc.pid}) died (killed by {signal.Signals(-proc.returncode).name}) during step {step}; "
                f"the other ranks stopped. {again_in(self.run_dir, sentence=True)}: {then}."
            )
        else:  # it raised: its own error, printed above, says what to fix before a rerun
            self.message = (
                f"tinytrain: rank {rank} (pid {proc.pid}) failed (exit status {proc.returncode}) during step {step}: its error is printed above; "
                f"the other ranks stopped. Once that is fixed, {again_in(self.run_dir)}: {then}."
            )

    def resume_hint(self) -> str:
        newest = step_checkpoints(self.run_dir / "checkpoints")
        return f"resume=auto continues from checkpoints/{newest[0][1].name}" if newest else "no step checkpoint was saved yet, so it starts over"


# What gloo and NCCL say when the other end of a collective is gone.
PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe", "remote process exited", "communicator was aborted", "socket timeout", "timed out")


def port_taken(given: str | None, slurm: bool) -> Problem:
    """The rendezvous port rank 0 could not open, and where it came from: the user's MASTER_PORT,
    or Lightning's (its SLURMEnvironment's from the job id, its local one a free port it picked)."""
    where = f"in use on {os.environ.get('MASTER_ADDR', 'this machine')}: rank 0 could not open the ranks' rendezvous there"
    port = os.environ.get("MASTER_PORT")
    if given is not None:
        fix = "export another MASTER_PORT in the job script, one no other job on the node uses" if slurm else "unset MASTER_PORT (Lightning then picks a free port), or give each run on a machine its own"
        return Problem("MASTER_PORT", given, f"is {where} (another run on this machine holds it, or another program)", fix)
    if slurm:
        return Problem("MASTER_PORT", port, f"(Lightning's, from the Slurm job id: 15000 + its last 4 digits) is {where}: another job on this node holds it", "export MASTER_PORT=<a free port> in the job script")
    return Problem("MASTER_PORT", port, f"(a free port Lightning picked) is {where}: another program took it in the meantime", "run the same command again (Lightning picks another), or export MASTER_PORT=<a free port>")


def rendezvous_done() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def address_in_use(exception: BaseException) -> bool:
    """torch's TCPStore could not listen: `... port: 29555, useIpv6: false, code: -98, name: EADDRINUSE ...`."""
    text = str(exception).lower()
    return "eaddrinuse" in text or "address already in use" in text


def lost_a_peer(exception: BaseException) -> bool:
    import torch.distributed as dist

    text = str(exception).lower()
    return isinstance(exception, dist.DistError) or any(marker in text for marker in PEER_GONE)


def first_line(exception: BaseException, limit: int = 120) -> str:
    line = next((part.strip() for part in str(exception).splitlines() if part.strip()), "")
    line = re.sub(r"^\[[^\]]*\]\s*", "", line)  # gloo's "[<its source file>:<line>] "
    return line if len(line) <= limit else line[: limit - 3] + "..."


def died(procs: list, wait_s: float = 2.0):
    """(rank, process) of the first child that exited with an error; the local ranks 1.. in order.
    Waits a moment: the peer's socket closes as it dies, a hair before it can be reaped."""
    deadline = time.monotonic() + wait_s
    while True:
        for rank, proc in enumerate(procs, start=1):
            if proc.poll() not in (None, 0):
                return rank, proc
        if time.monotonic() > deadline or not procs:
            return None
        time.sleep(0.05)

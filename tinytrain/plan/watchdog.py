"""The hang watchdog's limits, decided once: how long no rank may make progress in each phase
before the run is stopped with hang_report.txt (cluster/watchdog.py), and the process-group
timeout that follows from them.

A checkpoint save may legitimately take longer than cluster.slow_phase_timeout_s on a slow disk:
its limit is raised to SAVE_MARGIN x the plan's own estimate of one save, so the watchdog never
fires on a save the plan expected. The backend's collective timeout is set just above the
longest limit: the watchdog names the hang first, and a rank whose peers vanished (another node)
still leaves within minutes instead of the backend's 30-minute default.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinytrain.errors import Problem

SAVE_MARGIN = 3  # x the estimated save time
PG_TIMEOUT_MARGIN_S = 60  # above the longest limit


@dataclass(frozen=True)
class WatchdogPlan:
    enabled: bool
    hang_s: int  # training steps
    startup_s: int  # before the first step: data and op builds, rendezvous, model build
    slow_s: int  # validation, inline evals (eval.tasks), the first step (compile, warm-up)
    checkpoint_s: int  # a checkpoint save: slow_s, or SAVE_MARGIN x the estimated save when longer
    process_group_timeout_s: int  # torch.distributed's collective timeout
    reason: str

    def limits(self) -> dict[str, int]:
        """Seconds per heartbeat phase (cluster/heartbeat.py's PHASES)."""
        return {"startup": self.startup_s, "data": self.startup_s, "train": self.hang_s, "first_step": self.slow_s, "compile": self.slow_s, "validation": self.slow_s, "evals": self.slow_s, "checkpoint": self.checkpoint_s}

    def to_dict(self) -> dict:
        return asdict(self)


def watchdog_plan(cluster, save_seconds: float) -> WatchdogPlan:
    checkpoint = max(cluster.slow_phase_timeout_s, int(SAVE_MARGIN * save_seconds + 0.999))
    raised = checkpoint > cluster.slow_phase_timeout_s
    longest = max(cluster.hang_timeout_s, cluster.startup_timeout_s, cluster.slow_phase_timeout_s, checkpoint)
    if not cluster.watchdog:
        reason = "off (cluster.watchdog=false): a hang waits for the backend's collective timeout"
    else:
        reason = (
            f"on: no progress on any rank for {cluster.hang_timeout_s} s in a step, {cluster.startup_timeout_s} s before the first step, "
            f"{cluster.slow_phase_timeout_s} s in the first step, validation or evals, {checkpoint} s in a checkpoint save"
            + (f" ({SAVE_MARGIN} x the ~{save_seconds:.0f} s estimated save)" if raised else "")
            + f" -> hang_report.txt, exit 76; collective timeout {longest + PG_TIMEOUT_MARGIN_S} s"
        )
    return WatchdogPlan(cluster.watchdog, cluster.hang_timeout_s, cluster.startup_timeout_s, cluster.slow_phase_timeout_s, checkpoint, longest + PG_TIMEOUT_MARGIN_S, reason)


# torch's collective timeout is the longest limit + 60 s: a timedelta past ~1.1e14 s overflows (a
# traceback), and from ~1e10 s the rendezvous failed or stalled on two CPU ranks. 30 days is beyond
# any step, save or start-up a limit is for.
MAX_TIMEOUT_S = 30 * 24 * 3600


def watchdog_problems(cfg) -> list[Problem]:
    c = cfg.cluster
    problems = []
    for key, example in (("hang_timeout_s", 300), ("startup_timeout_s", 1800), ("slow_phase_timeout_s", 1800)):
        value = getattr(c, key)
        if not 0 < value <= MAX_TIMEOUT_S:  # NaN too
            problems.append(Problem(f"cluster.{key}", value, f"must be a number of seconds above 0 and at most {MAX_TIMEOUT_S} (30 days): the ranks' collective timeout is made from it", f"use e.g. cluster.{key}={example}, or cluster.watchdog=false to run without the hang watchdog"))
    if c.hang_timeout_s > 0 and c.startup_timeout_s > 0 and c.startup_timeout_s < c.hang_timeout_s:
        problems.append(Problem("cluster.startup_timeout_s", c.startup_timeout_s, f"is shorter than cluster.hang_timeout_s({c.hang_timeout_s}): start-up (data and op builds, rendezvous) takes longer than a step", f"use cluster.startup_timeout_s >= {c.hang_timeout_s}"))
    if c.hang_timeout_s > 0 and c.slow_phase_timeout_s > 0 and c.slow_phase_timeout_s < c.hang_timeout_s:
        problems.append(Problem("cluster.slow_phase_timeout_s", c.slow_phase_timeout_s, f"is shorter than cluster.hang_timeout_s({c.hang_timeout_s}): the first step (compilation), validation, inline evals and checkpoint saves take longer than a step", f"use cluster.slow_phase_timeout_s >= {c.hang_timeout_s}"))
    return problems

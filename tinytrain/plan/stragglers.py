"""Straggler checks, decided once: on for every run of more than one rank (cluster/stragglers.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinytrain.errors import Problem

MAX_THRESHOLD = 10.0  # 11x slower: beyond that a rank is hung, which is the watchdog's


@dataclass(frozen=True)
class StragglerPlan:
    enabled: bool
    every_n_steps: int
    threshold: float
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def straggler_plan(cluster, world: int) -> StragglerPlan:
    if world < 2:
        return StragglerPlan(False, cluster.straggler_every_n_steps, cluster.straggler_threshold, "off: one rank, nothing to compare")
    return StragglerPlan(
        True,
        cluster.straggler_every_n_steps,
        cluster.straggler_threshold,
        f"every {cluster.straggler_every_n_steps} steps the {world} ranks' forward times are compared; a rank more than "
        f"{100 * cluster.straggler_threshold:.0f}% slower than the others' median in 2 checks running is named (log, straggler/* metrics, summary)",
    )


def straggler_problems(cfg) -> list[Problem]:
    c = cfg.cluster
    problems = []
    if c.straggler_every_n_steps < 1:
        problems.append(Problem("cluster.straggler_every_n_steps", c.straggler_every_n_steps, "must be >= 1", "use e.g. cluster.straggler_every_n_steps=50"))
    if not 0 < c.straggler_threshold <= MAX_THRESHOLD:
        problems.append(Problem("cluster.straggler_threshold", c.straggler_threshold, f"must be above 0 and at most {MAX_THRESHOLD:g} (a fraction: 0.2 names a rank 20% slower than the others)", "use e.g. cluster.straggler_threshold=0.2"))
    return problems

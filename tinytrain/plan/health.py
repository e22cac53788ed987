"""The health check's decision (cluster/health.py): whether it runs before training, and what a
bad node does."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinytrain.cluster.slurm import job_id
from tinytrain.config.schema import BadNode, Mode
from tinytrain.errors import Problem

CHOICES = ("auto", "true", "false")


@dataclass(frozen=True)
class HealthPlan:
    enabled: bool
    on_bad_node: str
    budget_s: int
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def health_plan(cluster, world: int, on_gpu: bool) -> HealthPlan:
    choice = str(cluster.health_check).lower()
    if choice == "auto":
        enabled = on_gpu and world > 1
        why = "auto: on for GPU runs of 2+ ranks" if enabled else f"auto: off ({'one rank' if world < 2 else 'CPU'}); mode=health or cluster.health_check=true runs it"
    else:
        enabled = choice == "true"
        why = f"cluster.health_check={choice}"
    if enabled:
        why += f": matmul, memory and all-reduce on every rank within {cluster.health_budget_s} s before training; a bad node -> {cluster.on_bad_node.value}"
    return HealthPlan(enabled, cluster.on_bad_node.value, cluster.health_budget_s, why)


def health_problems(cfg) -> list[Problem]:
    c = cfg.cluster
    problems = []
    if str(c.health_check).lower() not in CHOICES:
        problems.append(Problem("cluster.health_check", c.health_check, "must be auto, true or false", "use cluster.health_check=auto (on for GPU runs of 2+ ranks)"))
    if c.health_budget_s <= 0:
        problems.append(Problem("cluster.health_budget_s", c.health_budget_s, "must be a positive number of seconds", "use e.g. cluster.health_budget_s=60"))
    if c.on_bad_node == BadNode.exclude and job_id() is None and cfg.mode not in (Mode.plan, Mode.sbatch):
        problems.append(Problem("cluster.on_bad_node", "exclude", "excluding a node means requeueing a Slurm job without it, and this is not a Slurm job", "use cluster.on_bad_node=stop (or warn) here; exclude in a job submitted with sbatch"))
    return problems

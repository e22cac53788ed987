"""OmegaConf resolvers, registered before Hydra composes: paths of bundled assets and what the
Slurm environment says (tasks per node, the run name of a job). Values tinytrain derives (vocab,
precision) are not resolvers: the plan decides each once (tinytrain/plan/run_plan.py)."""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

ASSETS = Path(__file__).resolve().parent.parent / "assets"


def _asset(name: str) -> str:
    return str(ASSETS / name)


def _slurm_tasks_per_node(default: int) -> int:
    from tinytrain.cluster.slurm import tasks_per_node

    return tasks_per_node(default)


def _run_name() -> str:
    from datetime import datetime

    from tinytrain.cluster import slurm

    # Every srun task evaluates this itself: a timestamp could differ between tasks of one job,
    # and a requeued job must find its own directory again.
    return slurm.run_name() or datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def register_resolvers() -> None:
    for name, fn in {
        "tt.asset": _asset,
        "tt.slurm_tasks_per_node": _slurm_tasks_per_node,
    }.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    if not OmegaConf.has_resolver("tt.run_name"):
        # Cached like Hydra's `now`: one name per process, however often run.name is read.
        OmegaConf.register_new_resolver("tt.run_name", _run_name, use_cache=True)

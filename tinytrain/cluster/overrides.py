"""The command line's overrides as the user typed them.

Hydra keeps them in a ListConfig under hydra.overrides.task; iterating it resolves each string as
an interpolation against the hydra node, so `'trainer.warmup_steps=${.micro_batch_size}'` raised
there, and `'data.cache_dir=${oc.env:SCRATCH}/cache'` reached a Slurm job's command line with the
login node's value. Read unresolved, they are passed on as typed.
"""

from __future__ import annotations


def task_overrides() -> list[str]:
    """hydra.overrides.task unresolved; [] where Hydra did not compose this config (tests, tools)."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return []
    task = OmegaConf.select(HydraConfig.get(), "overrides.task", default=None)
    return [str(o) for o in OmegaConf.to_container(task, resolve=False)] if task is not None else []

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


def hydra_overrides() -> list[str]:
    """hydra.overrides.hydra unresolved (the user's Hydra settings, hydra.run.dir=... among them, and
    Hydra's own hydra.mode); [] where Hydra did not compose this config."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    if not HydraConfig.initialized():
        return []
    own = OmegaConf.select(HydraConfig.get(), "overrides.hydra", default=None)
    return [str(o) for o in OmegaConf.to_container(own, resolve=False)] if own is not None else []


def script_overrides() -> list[str]:
    """What a Slurm script tinytrain writes passes on to its srun: the task's overrides and the
    user's own Hydra settings (`hydra/job_logging=stdout`, `hydra.verbose=true`), which a job run
    without them would not have. hydra.mode is Hydra's own entry for every run."""
    return task_overrides() + [o for o in hydra_overrides() if o.split("=", 1)[0] != "hydra.mode"]


# data.* settings that say where or how data is built, not which data: a mode=eval given only
# these scores its run's own data with them applied (data.cache_dir, which an unwritable recorded
# cache folder's refusal asks for, had it score the command's default corpus instead).
DATA_BUILD_SETTINGS = ("cache_dir", "tokenize_workers", "num_workers", "prepare_parts", "bad_records")


def data_keys_given() -> list[str]:
    """The data.* keys the command line sets (without the prefix; "" for the data group itself)."""
    keys = [o.lstrip("+~").split("=", 1)[0] for o in task_overrides()]
    return ["" if k == "data" else k.removeprefix("data.") for k in keys if k == "data" or k.startswith("data.")]


def names_data() -> bool:
    """Whether the command line names data (mode=eval then evaluates on it, not on the run's)."""
    return any(k not in DATA_BUILD_SETTINGS for k in data_keys_given())

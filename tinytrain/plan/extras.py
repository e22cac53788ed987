"""Optional stacks are extras of the tinytrain-llm distribution: a run that asks for one that is not
installed is a configuration error naming the extra, before anything is built (a plan with the
core alone works)."""

from __future__ import annotations

import importlib.util
from typing import Callable

from tinytrain.config.schema import FinetuneMethod, Strategy
from tinytrain.errors import Problem

DISTRIBUTION = "tinytrain-llm"


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def missing_extra_problems(cfg, is_installed: Callable[[str], bool] = installed) -> list[Problem]:
    """One problem per requested stack whose package is missing: the key that asked for it and the pip line."""
    wanted = []  # (key, value, extra, the module it needs)
    if cfg.parallel.strategy == Strategy.deepspeed:
        wanted.append(("parallel", cfg.parallel.name, "deepspeed", "deepspeed"))
    if cfg.logger.wandb:
        wanted.append(("logger", "wandb", "wandb", "wandb"))
    if cfg.finetune.method in (FinetuneMethod.lora, FinetuneMethod.qlora):
        wanted.append(("finetune", cfg.finetune.method.value, cfg.finetune.method.value, "peft"))
    if cfg.logger.tensorboard:
        wanted.append(("logger", "tensorboard", "tensorboard", "tensorboard"))
    return [
        Problem(key, value, f"needs the {extra} extra ({module} is not installed)", f"pip install '{DISTRIBUTION}[{extra}]' (or choose another {key})")
        for key, value, extra, module in wanted
        if not is_installed(module)
    ]

"""Optional stacks are extras of the tinytrain-llm distribution: a run that asks for one that is not
installed is a configuration error naming the extra, before anything is built (a plan with the
core alone works)."""

from __future__ import annotations

import importlib.util
import netrc
import os
from typing import Callable
from urllib.parse import urlparse

from tinytrain.config.schema import FinetuneMethod, Mode
from tinytrain.errors import Problem
from tinytrain.plan.parallel import strategy_row

DISTRIBUTION = "tinytrain-llm"


def installed(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def missing_extra_problems(cfg, is_installed: Callable[[str], bool] = installed) -> list[Problem]:
    """One problem per requested stack whose package is missing: the key that asked for it and the pip line."""
    wanted = []  # (key, value, extra, the module it needs)
    if strategy_row(cfg.parallel.strategy).deepspeed:
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


WANDB_MODES = ("online", "offline", "disabled", "dryrun", "run", "shared")


def wandb_problems(cfg) -> list[Problem]:
    lg = cfg.logger
    if not lg.wandb:
        return []
    problems = []
    if not str(lg.wandb_project).strip():
        problems.append(Problem("logger.wandb_project", lg.wandb_project, "is empty", "use e.g. logger.wandb_project=tinytrain"))
    mode = os.environ.get("WANDB_MODE")
    if mode is not None and mode not in WANDB_MODES:
        problems.append(Problem("WANDB_MODE", mode, f"is not a wandb mode ({', '.join(WANDB_MODES)})", "export WANDB_MODE=offline (no key or network needed) or online"))
    elif cfg.mode == Mode.train and mode in (None, "online", "run", "shared") and not _wandb_key():
        problems.append(
            Problem("logger", "wandb", "wandb would log online but finds no API key (WANDB_API_KEY, or `wandb login`'s ~/.netrc entry)", "export WANDB_MODE=offline (sync later with `wandb sync`), or run `wandb login` / set WANDB_API_KEY")
        )
    return problems


def _wandb_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
    try:
        return netrc.netrc(os.environ.get("NETRC")).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False

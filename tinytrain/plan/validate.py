"""Semantic checks on a composed config, all reported together before anything is built.

Hydra and the schemas already rejected unknown keys and wrong types; the problems that need more
than one key to see (tp vs heads, batch arithmetic, paths that must exist) are checked by the
module that owns the values: config/checks.py, data/checks.py (with data/sources.py,
data/mixture.py, data/chat_templates.py), data/tokenizer.py, checkpoint/, plan/families.py,
plan/parallel.py (the strategy table), plan/layout.py, plan/precision.py, plan/schedule.py, plan/hardware.py,
plan/extras.py, plan/levers.py, plan/micro_batch.py, plan/fp8.py, plan/finetune.py, plan/optimizer.py, plan/preference.py, plan/input_safety.py and plan/evals.py. This module only gathers them, so a user sees every problem
at once.
"""

from __future__ import annotations

from tinytrain.checkpoint.pretrained import pretrained_path_problems
from tinytrain.checkpoint.resume import checkpoint_problems
from tinytrain.config.checks import (
    checkpoint_path_problems,
    experiment_problems,
    guard_problems,
    home_path_problems,
    run_name_problems,
    trainer_problems,
    unknown_key_problems,
)
from tinytrain.data.checks import data_problems
from tinytrain.data.tokenizer import special_token_problems, tokenizer_problems
from tinytrain.errors import raise_if_any
from tinytrain.plan import context, evals, finetune, fp8, input_safety, levers, micro_batch, optimizer, parallel, preference, resolve
from tinytrain.plan.extras import missing_extra_problems, wandb_problems
from tinytrain.plan.families import model_problems
from tinytrain.plan.hardware import hardware_problems
from tinytrain.plan.health import health_problems
from tinytrain.plan.layout import cluster_problems, slurm_problems
from tinytrain.plan.parallel import parallel_problems, tp_model_problems
from tinytrain.plan.precision import precision_problems
from tinytrain.plan.schedule import schedule_problems
from tinytrain.plan.stragglers import straggler_problems
from tinytrain.plan.watchdog import watchdog_problems


def validate(cfg) -> None:
    """Raise one ConfigError listing every problem found."""
    cluster = cluster_problems(cfg)
    layout = parallel_problems(cfg) if not cluster else []
    # A cp the world cannot hold is fixed first: its kind (and the kind's rules) follow the fix's tp.
    cp_rules = context.problems(cfg) if not any(p.key == "parallel.cp" for p in layout) else []
    problems = (
        unknown_key_problems(cfg)
        + experiment_problems()
        + run_name_problems(cfg)
        + home_path_problems(cfg)
        + model_problems(cfg)
        + tp_model_problems(cfg)
        + pretrained_path_problems(cfg.model.pretrained)
        + cluster
        # The world size (nodes x devices) underlies the parallel and batch checks.
        + layout
        + cp_rules
        + slurm_problems(cfg)
        + watchdog_problems(cfg)
        + straggler_problems(cfg)
        + health_problems(cfg)
        + data_problems(cfg)
        + trainer_problems(cfg)
        + checkpoint_path_problems(cfg)
        + levers.problems(cfg)
        + micro_batch.problems(cfg, resolve.effective_hardware(cfg))
        # under a batch ramp the schedule counts tokens: plan/layout.py with_ramp checks the decay
        + (schedule_problems(cfg.trainer) if cfg.trainer.batch_size_warmup.start is None else [])
        + optimizer.problems(cfg)
        + precision_problems(cfg)
        + fp8.problems(cfg)
        + guard_problems(cfg)
        + hardware_problems(cfg)
        + tokenizer_problems(cfg)
        + special_token_problems(cfg)
        + missing_extra_problems(cfg)
        + wandb_problems(cfg)
        + checkpoint_problems(cfg)
        + parallel.checkpoint_problems(cfg)
        + finetune.problems(cfg)
        + preference.problems(cfg)
        + input_safety.problems(cfg)
        + evals.problems(cfg)  # last: it may index lm-eval's tasks (seconds)
    )
    raise_if_any(problems)

"""Checks of config keys that need no other stage to see (plan/validate.py gathers them with the
rest): keys no schema declares, a missing experiment option, the run name, the trainer's and the
guard's numbers."""

from __future__ import annotations

import dataclasses
import difflib
import math

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from tinytrain.config import CONF_DIR
from tinytrain.config.resolvers import run_name_problem
from tinytrain.config.schema import Config
from tinytrain.errors import Problem


def unknown_key_problems(cfg) -> list[Problem]:
    """Keys added with `+key=value` that no schema declares (Hydra lets `+` add anything), at any depth."""
    return _unknown_keys(cfg, Config, "")


def removed_key_problems(cfg) -> list[Problem]:
    """Top-level keys removed with `~key` (Hydra lets '~' delete from the root, which is no struct;
    deeper keys it refuses itself): tinytrain reads every one, and a missing one was a traceback."""
    problems = []
    for field in dataclasses.fields(Config):
        if field.name not in cfg:
            group = field.default_factory is not dataclasses.MISSING
            problems.append(Problem(field.name, None, f"was removed with '~{field.name}', and tinytrain reads every top-level key", f"drop '~{field.name}'; to change it, set {field.name}{'.<key>' if group else ''}=<value>"))
    return problems


def _unknown_keys(node, schema, prefix: str) -> list[Problem]:
    fields = {f.name: f for f in dataclasses.fields(schema)}
    problems = []
    for key in node:
        full = f"{prefix}{key}"
        if key not in fields:
            close = difflib.get_close_matches(str(key), list(fields), n=1, cutoff=0.6)
            fix = f"did you mean {prefix}{close[0]}? Otherwise remove it" if close else "remove it"
            problems.append(Problem(full, node[key], "is not a tinytrain config key", f"{fix}; the keys there are {', '.join(sorted(fields))}"))
            continue
        sub = fields[key].default_factory if fields[key].default_factory is not dataclasses.MISSING else None
        # _get_node: the child without resolving interpolations (model.vocab_size loads the tokenizer).
        if sub is not None and dataclasses.is_dataclass(sub) and isinstance(node._get_node(key), DictConfig):
            problems += _unknown_keys(node._get_node(key), sub, f"{full}.")
    return problems


def experiment_problems() -> list[Problem]:
    """`experiment` is an optional group, and Hydra skips a missing optional option silently."""
    if not HydraConfig.initialized():
        return []
    choice = HydraConfig.get().runtime.choices.get("experiment")
    options = experiment_options()
    if choice not in (None, "null") and choice not in options:
        return [Problem("experiment", choice, f"no such option in config group 'experiment' (available: {', '.join(options)})", "pick one of those, or add experiment/<name>.yaml to tinytrain/conf/ or to your own --config-dir")]
    return []


# Keys naming files or folders (besides run.root, refused in hydra.run.dir's resolver).
PATH_KEYS = ("model.pretrained", "tokenizer.path", "data.path", "data.val_path", "data.store", "data.cache_dir", "checkpoint.path", "checkpoint.init_from", "export.dir", "generate.prompts_file", "resume")


def home_path_problems(cfg) -> list[Problem]:
    """`~` reaches tinytrain unexpanded (no shell between; Hydra keeps it): a quoted '~/data' was
    looked for, or written, in a folder named `~` of the current one."""
    named = [(key, OmegaConf.select(cfg, key)) for key in PATH_KEYS]
    named += [(f"data.sources[{i}].path", source.get("path")) for i, source in enumerate(cfg.data.sources or [])]
    named += [(f"checkpoint.average[{i}]", path) for i, path in enumerate(cfg.checkpoint.average or [])]
    return [Problem(key, value, "starts with '~', which nothing expands here (it would name a folder called '~' in the current one)", home_fix(key, value)) for key, value in named if isinstance(value, str) and value.startswith("~")]


def home_fix(key: str, value: str) -> str:
    """The override with the home folder written out, quoted for the shell (`${...}` unquoted is
    bash's "bad substitution"); another user's `~name` has no such form."""
    if value == "~" or value.startswith("~/"):
        return f"write the home folder out: '{key}=${{oc.env:HOME}}{value[1:]}' (quoted as shown), or give an absolute path"
    return f"give the absolute path instead of {value.split('/')[0]}"


def experiment_options() -> list[str]:
    """The experiment group's options on Hydra's search path: the package's and those of a user's
    --config-dir or hydra.searchpath (a glob of the package's folder alone refused the user's own)."""
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return sorted(GlobalHydra.instance().config_loader().get_group_options("experiment"))
    return sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


def run_name_problems(cfg) -> list[Problem]:
    problem = run_name_problem(str(cfg.run.name))
    return [problem] if problem else []


def checkpoint_path_problems(cfg) -> list[Problem]:
    """checkpoint=<path> (checkpoint.path) names what the output modes read: a training run or its
    plan ignored it without a word and started from scratch."""
    mode = getattr(cfg.mode, "value", cfg.mode)
    if cfg.checkpoint.path is None or mode not in ("train", "plan", "sbatch"):
        return []
    return [
        Problem(
            "checkpoint.path",
            cfg.checkpoint.path,
            f"is what mode=export|generate|eval read; mode={mode} does not start from it",
            f"start a new run from its weights with checkpoint.init_from={cfg.checkpoint.path}, or continue its run with resume=<its step checkpoint> (docs/checkpoints.md)",
        )
    ]


SEED_MAX = 2**32 - 1  # numpy's seed range, which Lightning's seed_everything checks


def trainer_problems(cfg) -> list[Problem]:
    t = cfg.trainer
    problems = []
    if not 0 <= cfg.seed <= SEED_MAX:  # it passed the plan and died seeding, after the data was built
        problems.append(Problem("seed", cfg.seed, f"must be between 0 and {SEED_MAX} (numpy's seed range)", "use e.g. seed=1234"))
    for key in ("max_steps", "log_every_n_steps", "val_every_n_steps", "checkpoint_every_n_steps"):
        if getattr(t, key) < 1:
            problems.append(Problem(f"trainer.{key}", getattr(t, key), "must be >= 1", "use a positive integer"))
    if t.warmup_steps < 0 or t.warmup_steps >= t.max_steps:
        problems.append(Problem("trainer.warmup_steps", t.warmup_steps, f"must be >= 0 and below trainer.max_steps({t.max_steps})", "shorten the warm-up"))
    if not 0 < t.lr < math.inf:  # written so that nan fails too
        problems.append(Problem("trainer.lr", t.lr, "must be positive and finite", "use e.g. trainer.lr=3e-4"))
    if not 0.0 <= t.min_lr_ratio <= 1.0:
        problems.append(Problem("trainer.min_lr_ratio", t.min_lr_ratio, "must be between 0 and 1", "use e.g. 0.1"))
    if len(t.betas) != 2:
        problems.append(Problem("trainer.betas", list(t.betas), "needs two values", "use e.g. trainer.betas=[0.9,0.95]"))
    elif not all(0.0 <= b < 1.0 for b in t.betas):
        problems.append(Problem("trainer.betas", list(t.betas), "each must be in [0, 1) (AdamW's moment decay rates)", "use e.g. trainer.betas=[0.9,0.95]"))
    if not 0 < t.eps < math.inf:
        problems.append(Problem("trainer.eps", t.eps, "must be positive and finite (AdamW divides by sqrt(v) + eps)", "use e.g. trainer.eps=1e-8"))
    for key, fix in (("weight_decay", "use 0 for none, e.g. 0.1"), ("grad_clip", "use 0 for no clipping, e.g. 1.0"), ("val_batches", "use 0 for no validation, e.g. 8")):
        if not 0 <= getattr(t, key) < math.inf:  # nan turned clipping off without a word
            problems.append(Problem(f"trainer.{key}", getattr(t, key), "must be a finite number >= 0", fix))
    for key in ("global_batch_size", "accumulate_grad_batches"):
        if getattr(t, key) is not None and getattr(t, key) < 1:
            problems.append(Problem(f"trainer.{key}", getattr(t, key), "must be >= 1", f"use a positive integer, or null to derive it (trainer.{key}=null)"))
    if t.profile_start < 0:
        problems.append(Problem("trainer.profile_start", t.profile_start, "must be >= 0 (a step of this process, counted from 0)", "use e.g. trainer.profile_start=3 (after the first steps' compilation and allocation)"))
    if t.profile_steps < 1:
        problems.append(Problem("trainer.profile_steps", t.profile_steps, "must be >= 1", "use e.g. trainer.profile_steps=3"))
    elif t.profile and t.profile_start >= 0 and t.profile_start + t.profile_steps > t.max_steps:
        problems.append(Problem("trainer.profile_start", t.profile_start, f"the profiled steps {t.profile_start}-{t.profile_start + t.profile_steps - 1} end beyond trainer.max_steps({t.max_steps})", f"use trainer.profile_start <= {max(0, t.max_steps - t.profile_steps)} (or fewer trainer.profile_steps)"))
    if t.loss_chunk_tokens is not None and t.loss_chunk_tokens < 0:
        problems.append(Problem("trainer.loss_chunk_tokens", t.loss_chunk_tokens, "must be >= 0", "use 0 for plain cross-entropy, null to decide by vocab size, or e.g. 1024"))
    return problems


def guard_problems(cfg) -> list[Problem]:
    g = cfg.guard
    problems = []
    if g.max_consecutive_skips < 0:
        problems.append(Problem("guard.max_consecutive_skips", g.max_consecutive_skips, "must be >= 0", "use 0 to stop at the first non-finite step, e.g. 3"))
    if g.loss_scale_halvings < 1:
        problems.append(Problem("guard.loss_scale_halvings", g.loss_scale_halvings, "must be >= 1", "use e.g. 8"))
    if not g.grad_spike_factor > 1:
        problems.append(Problem("guard.grad_spike_factor", g.grad_spike_factor, "must be above 1 (a spike is a norm this many times the running average)", "use e.g. 5"))
    if g.grad_spike_warmup < 0:
        problems.append(Problem("guard.grad_spike_warmup", g.grad_spike_warmup, "must be >= 0", "use e.g. 20"))
    return problems

"""mode=export | generate | eval (and average's export.dir) planned like training: every setting checked, all problems at
once (key, value, fix), before a checkpoint or model is read."""

from __future__ import annotations

from pathlib import Path

from tinytrain.checkpoint.export_target import export_dir_problems, export_folder_problems
from tinytrain.checkpoint.formats import CheckpointFormat, format_of
from tinytrain.checkpoint.remote_code import remote_code_problems
from tinytrain.config.checks import home_path_problems
from tinytrain.config.generate_checks import sampling_problems
from tinytrain.config.schema import Mode
from tinytrain.errors import ConfigError, Problem
from tinytrain.model.generation import read_prompts
from tinytrain.outputs import backfill, saved_run
from tinytrain.plan import evals

KEY = saved_run.KEY


def problems(cfg, run_dir: Path, data_overridden: bool = False) -> list[Problem]:
    if cfg.mode == Mode.doctor:
        return []  # reads nothing of a run
    if cfg.mode == Mode.health:
        from tinytrain.plan.health import health_problems
        from tinytrain.plan.layout import cluster_problems

        return cluster_problems(cfg) + health_problems(cfg)
    home = home_path_problems(cfg)
    if home:  # each path is read or written under a folder called '~'
        return home
    # mode=average names its checkpoints in checkpoint.average (outputs/average.py checks them).
    found = [] if cfg.mode == Mode.average else source_problems(cfg, run_dir)
    if cfg.mode == Mode.generate:
        found += sampling_problems(cfg.generate) + prompt_problems(cfg.generate)
    if cfg.mode == Mode.eval and cfg.checkpoint.path and backfill.is_run_folder(Path(cfg.checkpoint.path)):
        run = Path(cfg.checkpoint.path)
        code = backfill.inherited_code_problems(cfg, run)  # before evals.problems builds (imports) the tasks
        return backfill.problems(cfg, run) + (code or evals.problems(cfg, backfill.eval_settings(cfg, run)))
    if cfg.mode == Mode.eval:
        found += eval_problems(cfg, data_overridden)
    if cfg.mode in (Mode.export, Mode.average) and cfg.export.dir:
        found += export_dir_problems("export.dir", Path(cfg.export.dir))
    return found


def source_problems(cfg, run_dir: Path) -> list[Problem]:
    """checkpoint.path: there, and when it is a Hugging Face folder, complete and without code to run."""
    value = cfg.checkpoint.path
    if value and value not in ("final", "last"):
        interrupted = export_folder_problems(KEY, Path(value))
        if interrupted and not Path(value).exists():
            return interrupted
    try:
        path = saved_run.locate(value, run_dir)
    except ConfigError as e:
        return e.problems
    if format_of(path).format is not CheckpointFormat.hf_export:
        return []  # a checkpoint: read, with its run's config, by saved_run.load
    return remote_code_problems(KEY, path, bool(cfg.model.trust_remote_code)) + export_folder_problems(KEY, path)


def prompt_problems(g) -> list[Problem]:
    found = [Problem(f"generate.prompts[{i}]", p, "is blank: there is nothing to continue", "give each prompt some text") for i, p in enumerate(g.prompts) if not str(p).strip()]
    try:
        read_prompts(g.prompts, g.prompts_file)
    except ConfigError as e:
        found += e.problems
    return found


def eval_problems(cfg, data_overridden: bool) -> list[Problem]:
    e = cfg.eval
    found = []
    if e.batches is not None and e.batches < 1:
        found.append(Problem("eval.batches", e.batches, "must be >= 1, or null for the run's own validation batches", "use eval.batches=null, or a positive count"))
    found += evals.problems(cfg)  # eval.tasks, eval.include, eval.limit (plan/evals.py)
    path = cfg.data.path
    if data_overridden and path and not Path(path).exists():
        found.append(Problem("data.path", path, "no such file or folder", "give the data to evaluate on (its held-out split is used), or leave data unset to use the run's"))
    return found

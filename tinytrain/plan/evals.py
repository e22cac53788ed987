"""Downstream evaluation while training (eval.tasks): which tasks, where, when and how many
documents, decided once and printed by the plan; every problem found before any weights.

The scoring itself is train/callbacks/evals.py (inline) over lm-eval's tasks; task names are
resolved by lm-eval's TaskManager (plan/eval_tasks.py), imported only when eval.tasks is set.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from tinytrain.config.schema import PLANNING_MODES, EvalAt, EvalWhere, Mode
from tinytrain.errors import Problem
from tinytrain.plan import eval_tasks

RENAMED = {"lm_eval_tasks": "tasks", "lm_eval_include": "include", "lm_eval_limit": "limit"}


@dataclass(frozen=True)
class EvalPlan:
    tasks: tuple[str, ...]  # eval.tasks as given
    leaves: tuple[str, ...]  # the lm-eval tasks they expand to
    include: tuple[str, ...]
    builtin: bool  # lm-eval's own task index is needed (a name outside eval.include)
    where: str
    every_n_steps: int | None  # the scoring cadence in optimizer steps; None: the final weights only
    cadence: str  # "every step checkpoint" | "every N steps" | "the final weights"
    limit: int | None
    shards: int  # the data-parallel ranks the requests are split over

    def to_dict(self) -> dict:
        return asdict(self)

    def scores_at(self, step: int, max_steps: int) -> bool:
        """Step 0 never: under gradient accumulation the first micro batches end before any step."""
        return step == max_steps or bool(self.every_n_steps and step > 0 and step % self.every_n_steps == 0)


def problems(cfg, e=None) -> list[Problem]:
    """All of eval.*'s problems for a training run (and mode=eval's tasks; `e`: the eval settings
    scored when not cfg.eval's, a run's own): cheap ones first, then the tasks as lm-eval resolves them."""
    e = cfg.eval if e is None else e
    found = [Problem(f"eval.{old}", getattr(e, old), f"is renamed eval.{new}", f"use eval.{new}=... (docs/evaluation.md)") for old, new in RENAMED.items() if getattr(e, old) not in (None, [])]
    for key in ("limit", "every_n_steps"):
        value = getattr(e, key)
        if value is not None and value < 1:
            found.append(Problem(f"eval.{key}", value, "must be >= 1", f"use eval.{key}=null, or a positive count"))
    if e.every_n_steps is not None and EvalAt(e.at) == EvalAt.end:
        found.append(Problem("eval.every_n_steps", e.every_n_steps, "contradicts eval.at=end (the final weights only)", "leave eval.every_n_steps=null, or drop eval.at=end"))
    for i, folder in enumerate(e.include):
        found += include_problems(f"eval.include[{i}]", folder)
    if not e.tasks:
        return found
    inline = cfg.mode != Mode.eval and EvalWhere(e.where) == EvalWhere.inline
    if cfg.mode != Mode.eval and EvalWhere(e.where) == EvalWhere.slurm:
        found += slurm_problems(cfg)
    if inline and cfg.parallel.cp not in (None, 1):
        found.append(Problem("eval.tasks", list(e.tasks), f"inline scoring does not split sequences over parallel.cp={cfg.parallel.cp}", "use eval.where=slurm, score the checkpoints with mode=eval, or train with parallel.cp=1"))
    if not eval_tasks.installed():
        return found + [Problem("eval.tasks", list(e.tasks), "lm-eval (lm-evaluation-harness) is not installed", "pip install 'tinytrain-llm[eval]', or leave eval.tasks empty")]
    if found:
        return found  # the folders must be right before lm-eval indexes them
    return found + task_problems(e, inline=inline)


def slurm_problems(cfg) -> list[Problem]:
    """eval.where=slurm: rank 0 submits a job per checkpoint with sbatch, from a script of checked values."""
    import shutil

    from tinytrain.cluster import eval_jobs
    from tinytrain.cluster.sbatch import hydra_context

    found = []
    if cfg.mode not in PLANNING_MODES and shutil.which("sbatch") is None:
        found.append(Problem("eval.where", "slurm", "sbatch is not on PATH here, and the training's rank 0 submits each checkpoint's eval job with it", "use eval.where=inline, or train where Slurm's client commands are installed"))
    e, every = cfg.eval, cfg.trainer.checkpoint_every_n_steps
    if e.every_n_steps is not None and e.every_n_steps % every:
        found.append(Problem("eval.every_n_steps", e.every_n_steps, f"eval.where=slurm scores saved checkpoints, and a checkpoint is saved every trainer.checkpoint_every_n_steps={every} steps", f"use a multiple of {every}, or leave eval.every_n_steps=null (every checkpoint)"))
    _, run_dir = hydra_context()
    return found + eval_jobs.value_problems(cfg, str(run_dir.resolve()) if run_dir else "", str(Path.cwd()))


def include_problems(key: str, folder: str) -> list[Problem]:
    tasks = Path(folder)
    if not tasks.is_dir():
        return [Problem(key, folder, "no such folder", "point it at a folder of lm-eval task YAMLs")]
    if not any(tasks.rglob("*.yaml")) and not any(tasks.rglob("*.yml")):
        return [Problem(key, folder, "holds no task YAML (*.yaml)", "write the task's YAML there (docs/evaluation.md has one), or drop the folder from eval.include")]
    return []


def task_problems(e, *, inline: bool) -> list[Problem]:
    include = tuple(e.include)
    resolved = eval_tasks.resolve(tuple(e.tasks), include)
    found = []
    unreadable = eval_tasks.unreadable_yamls(include) if resolved.unknown else {}
    for name, near in zip(resolved.unknown, resolved.suggestions):
        # lm-eval skips a YAML it cannot read without a word: the one that names the task says why.
        skipped = [f"{path}, which names it: it does not load ({why})" for path, why in unreadable.items() if name in Path(path).read_text(errors="replace")]
        if skipped:
            found.append(Problem("eval.tasks", name, f"is no lm-eval task, group or tag: lm-eval skipped {skipped[0]}", "correct that YAML, then check it with mode=plan"))
            continue
        hint = f"did you mean {near!r}? " if near else ""
        found.append(Problem("eval.tasks", name, f"is no lm-eval task, group or tag{' in eval.include or lm-eval' if e.include else ''}", f"{hint}list them with `lm_eval ls tasks`, or add its YAML to a folder in eval.include"))
    for t in resolved.leaves:
        found += leaf_problems(t, include, inline=inline)
    return found


def leaf_problems(t: eval_tasks.TaskInfo, include: tuple[str, ...], *, inline: bool) -> list[Problem]:
    found = []
    if t.data_problem:
        found.append(Problem("eval.tasks", t.name, f"{t.data_problem}", "give it local data (a task YAML in eval.include with dataset_path: json and data_files), or run where the hub is reachable"))
    types = eval_tasks.output_types()
    if t.output_type is not None and t.output_type not in types:
        near = eval_tasks.closest_of(t.output_type, types)
        return found + [Problem("eval.tasks", t.name, f"{t.yaml_path} says output_type: {t.output_type}, which is none of lm-eval's ({', '.join(types)})", f"set output_type: {near or 'multiple_choice'} (or another of lm-eval's) in {t.yaml_path}")]
    if not t.data_problem and eval_tasks.local(t, include) and (built := eval_tasks.build_problem(t, include)):
        found.append(built)
    if inline and t.output_type not in eval_tasks.INLINE_OUTPUTS:
        found.append(Problem("eval.tasks", t.name, f"is a {t.output_type or 'python-defined'} task: inline scoring serves log-likelihood and multiple-choice tasks ({', '.join(eval_tasks.INLINE_OUTPUTS)})", "drop it from eval.tasks and score it on an export with lm_eval (its hf model)"))
    return found


def make(cfg, *, data_parallel: int) -> EvalPlan | None:
    """The run's evaluation plan (None without eval.tasks); validate() has passed."""
    e = cfg.eval
    if not e.tasks:
        return None
    resolved = eval_tasks.resolve(tuple(e.tasks), tuple(e.include))
    if e.every_n_steps is not None:
        every, cadence = e.every_n_steps, f"every {e.every_n_steps} steps"
    elif EvalAt(e.at) == EvalAt.checkpoints:
        every, cadence = cfg.trainer.checkpoint_every_n_steps, "every step checkpoint"
    else:
        every, cadence = None, "the final weights"
    leaves = tuple(t.name for t in resolved.leaves)
    return EvalPlan(tuple(e.tasks), leaves, tuple(e.include), resolved.builtin, EvalWhere(e.where).value, every, cadence, e.limit, data_parallel)


def render(ev: dict, max_steps: int) -> str:
    names = ", ".join(ev["tasks"])
    leaves = f" ({len(ev['leaves'])} tasks)" if list(ev["leaves"]) != list(ev["tasks"]) else ""
    times = len([s for s in range(1, max_steps + 1) if s == max_steps or (ev["every_n_steps"] and s % ev["every_n_steps"] == 0)])
    when = f"at {ev['cadence']}" + (f" (every {ev['every_n_steps']} steps)" if ev["cadence"] == "every step checkpoint" else "") + (" and the final weights" if ev["every_n_steps"] else "")
    limit = f"limit {ev['limit']} documents per task" if ev["limit"] else "every document"
    where = f"inline on the training ranks (requests split over {ev['shards']} data-parallel rank(s))" if ev["where"] == "inline" else "a one-GPU Slurm job per checkpoint (lm-eval's hf model on its export; training does not wait)"
    outputs = "evals.csv, eval/<task>/<metric> in the loggers" if ev["where"] == "inline" else "evals.csv (appended by each job)"
    return f"evals      {names}{leaves}: {where}, {when}: {times} scoring(s); {limit} -> {outputs}"

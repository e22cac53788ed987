"""eval.tasks resolved through lm-eval's own TaskManager, before any weights: each name to its leaf
tasks, with the kind of request each makes and whether its data can be read from here. A task of
eval.include over local files is also built by lm-eval and its first document rendered, as the
scoring will: a broken data file or template is found before training, not at its first scoring.

lm-eval is imported only here and only when eval.tasks is set (its import and its index of some
15,000 task YAMLs take seconds): the folders of eval.include are indexed alone first, and lm-eval's
own tasks only when a name is not found there.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import io
import logging
import os
import socket
from contextlib import contextmanager, redirect_stderr
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from tinytrain.errors import Problem

# lm-eval's file loaders (datasets' packaged builders): their data_files are read from disk.
FILE_BUILDERS = ("json", "csv", "parquet", "text", "arrow")
# What inline scoring serves (train/eval_lm.py): log-likelihoods, not generation.
INLINE_OUTPUTS = ("loglikelihood", "loglikelihood_rolling", "multiple_choice")


@dataclass(frozen=True)
class TaskInfo:
    name: str
    output_type: str | None  # lm-eval's output_type; None when the YAML does not say (a python task)
    dataset_path: str | None
    data_problem: str | None  # why the data cannot be read from here, or None
    yaml_path: str | None  # the task's YAML (None: a python task)
    data_files: tuple[str, ...]  # dataset_kwargs.data_files, as written


@dataclass(frozen=True)
class Resolved:
    unknown: tuple[str, ...]  # names lm-eval does not know, with its suggestion
    suggestions: tuple[str, ...]
    leaves: tuple[TaskInfo, ...]  # every leaf task the names expand to
    builtin: bool  # lm-eval's own index was needed (not only the eval.include folders)


def task_code(include: tuple[str, ...]) -> list[str]:
    """The Python the eval.include folders make lm-eval import: their .py files, and the YAMLs whose
    `!function` names one."""
    found = []
    for folder in map(Path, include):
        if not folder.is_dir():
            continue
        found += [str(p) for p in sorted(folder.rglob("*.py"))]
        for config in sorted([*folder.rglob("*.yaml"), *folder.rglob("*.yml")]):
            try:
                if "!function" in config.read_text(encoding="utf-8", errors="replace"):
                    found.append(f"{config} (!function)")
            except OSError:
                continue  # unreadable: the task build names it
    return found


def installed() -> bool:
    return importlib.util.find_spec("lm_eval") is not None


def task_manager(include: tuple[str, ...], builtin: bool):
    from lm_eval.tasks import TaskManager

    return TaskManager(include_path=list(include) or None, include_defaults=builtin)


@functools.lru_cache(maxsize=8)
def resolve(names: tuple[str, ...], include: tuple[str, ...]) -> Resolved:
    """The names' leaf tasks (cached: validate and the planner both ask)."""
    builtin = not include
    manager = task_manager(include, builtin)
    if include and any(n not in manager.task_index for n in names):
        builtin = True
        manager = task_manager(include, builtin)
    index = manager.task_index
    unknown = tuple(n for n in names if n not in index)
    suggestions = tuple(closest(n, index) for n in unknown)
    leaves: dict[str, TaskInfo] = {}
    for n in names:
        if n in index:
            for leaf in leaf_names(n, index, manager):
                leaves.setdefault(leaf, task_info(leaf, index))
    return Resolved(unknown, suggestions, tuple(leaves.values()), builtin)


def leaf_names(name: str, index, manager, seen: frozenset = frozenset()) -> list[str]:
    """A task -> itself; a group -> its tasks; a tag -> the tasks tagged with it (recursively)."""
    from lm_eval.tasks._index import Kind

    entry = index.get(name)
    if entry is None or name in seen:
        return []
    seen = seen | {name}
    if entry.kind in (Kind.TASK, Kind.PY_TASK):
        return [name]
    if entry.kind == Kind.GROUP:
        members = (entry.cfg or {}).get("task", [])
        members = [m if isinstance(m, str) else m.get("task") for m in (members if isinstance(members, list) else [members])]
    else:  # a tag
        members = [k for k, e in index.items() if name in as_list((e.cfg or {}).get("tag"))]
    return [leaf for m in members if isinstance(m, str) for leaf in leaf_names(m, index, manager, seen)]


def as_list(value) -> list:
    return value if isinstance(value, list) else [] if value is None else [value]


def task_info(name: str, index) -> TaskInfo:
    cfg = dict(index[name].cfg or {})
    yaml_path = index[name].yaml_path
    if "include" in cfg and yaml_path is not None:  # the fields of the YAMLs it includes too
        from lm_eval.tasks._yaml_loader import load_yaml

        try:
            cfg = load_yaml(yaml_path, resolve_func=False, recursive=True)
        except Exception:  # lm-eval skips a YAML it cannot read the same way; the task is then unknown to it
            pass
    path = cfg.get("dataset_path")
    kwargs = cfg.get("dataset_kwargs") or {}
    folder = Path(yaml_path).parent if yaml_path else Path.cwd()
    return TaskInfo(name, cfg.get("output_type"), path, data_problem(path, kwargs, folder), str(yaml_path) if yaml_path else None, tuple(flatten(kwargs.get("data_files"))))


def data_problem(path: str | None, kwargs: dict, folder: Path) -> str | None:
    """None when the task's data can be read from here: local files, a local folder, or the hub
    when it answers (or the dataset is in the datasets cache)."""
    if path is None:
        return None  # a python task: its own code loads the data
    if path in FILE_BUILDERS:
        files = [f for f in flatten(kwargs.get("data_files")) if not f.startswith(("http://", "https://", "hf://"))]
        if not files and not kwargs.get("data_dir"):
            return f"dataset_path: {path} names no data_files"
        missing = [f for f in files if not glob.glob(f) and not glob.glob(str(folder / f))]
        return f"its data file {missing[0]} does not exist" if missing else None
    if Path(path).exists():
        return None
    if in_datasets_cache(path):
        return None
    if not hub_reachable():
        return f"its data is the hub dataset {path!r}, which is not in the datasets cache, and the hub is not reachable from here"
    return None


def local(t: TaskInfo, include: tuple[str, ...]) -> bool:
    """A task of eval.include whose data is local files or a local folder: cheap to build here."""
    if t.yaml_path is None or t.dataset_path is None or t.data_problem:
        return False
    inside = any(Path(t.yaml_path).resolve().is_relative_to(Path(f).resolve()) for f in include)
    return inside and (t.dataset_path in FILE_BUILDERS or Path(t.dataset_path).exists())


@functools.lru_cache(maxsize=32)
def build_problem(t: TaskInfo, include: tuple[str, ...]) -> Problem | None:
    """None when lm-eval builds the task (reading its documents) and renders its first document's
    requests (prompt, choices, target) as the scoring does; else what lm-eval said, with the file."""
    from datasets.exceptions import DatasetGenerationError
    from jinja2 import TemplateError

    manager = task_manager(include, False)
    with quiet():
        try:
            task = manager.load([t.name])["tasks"][t.name]
            task.build_all_requests(limit=1)
        except DatasetGenerationError as e:
            files = ", ".join(t.data_files) or t.dataset_path
            return Problem("eval.tasks", t.name, f"its data ({files}, from {t.yaml_path}) does not load: {innermost(e)}", "correct the data file (.jsonl: one JSON object per line), then check it with mode=plan")
        except TemplateError as e:
            return Problem("eval.tasks", t.name, f"{t.yaml_path} does not render its first document: {innermost(e)}", "name the data's fields in doc_to_text, doc_to_target and doc_to_choice ({{question}} for a field question), then check it with mode=plan")
        except Exception as e:  # lm-eval's own checks of the YAML, a process_docs that fails, ...
            return Problem("eval.tasks", t.name, f"lm-eval cannot build it from {t.yaml_path}: {innermost(e)}", "correct the task's YAML, then check it with mode=plan")
    return None


def innermost(e: BaseException) -> str:
    """The error under the wrappers (datasets' DatasetGenerationError holds the parser's)."""
    while e.__cause__ is not None:
        e = e.__cause__
    return f"{type(e).__name__}: {e}"


@contextmanager
def quiet():
    """lm-eval's notes on a task's defaults, the progress bars and datasets' own report of a file
    that does not load off while a task is built here: the problem is reported once, as a Problem."""
    loggers = {name: logging.getLogger(name).level for name in ("lm_eval", "datasets")}
    for name in loggers:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    try:
        with redirect_stderr(io.StringIO()):  # the bars: tqdm reads TQDM_DISABLE only as it is imported
            yield
    finally:
        for name, level in loggers.items():
            logging.getLogger(name).setLevel(level)


def flatten(files) -> list[str]:
    if files is None:
        return []
    if isinstance(files, str):
        return [files]
    if isinstance(files, dict):
        return [f for v in files.values() for f in flatten(v)]
    return [f for v in files for f in flatten(v)]


def in_datasets_cache(path: str) -> bool:
    from datasets import config

    cached = Path(config.HF_DATASETS_CACHE) / path.replace("/", "___")
    return cached.is_dir()


@functools.lru_cache(maxsize=1)
def hub_reachable() -> bool:
    """The hub answers a connection within 3 s (and offline mode is not set)."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        return False
    url = urlparse(constants.ENDPOINT)
    try:
        socket.create_connection((url.hostname, url.port or 443), timeout=3).close()
        return True
    except OSError:
        return False


def closest(name: str, index) -> str:
    return closest_of(name, list(index))


def closest_of(name: str, names: list[str]) -> str:
    import difflib

    found = difflib.get_close_matches(name, names, n=1, cutoff=0.6)
    return found[0] if found else ""


def output_types() -> list[str]:
    """lm-eval's output types (a YAML with another is refused as the task is built)."""
    from lm_eval.api.task import ALL_OUTPUT_TYPES

    return list(ALL_OUTPUT_TYPES)


def unreadable_yamls(include: tuple[str, ...]) -> dict[str, str]:
    """The task YAMLs of the eval.include folders that lm-eval's loader cannot read (their index
    leaves them out without a word), each with the loader's error on one line."""
    from lm_eval.tasks._yaml_loader import load_yaml

    found = {}
    for folder in include:
        for path in sorted(Path(folder).rglob("*.yaml")):
            try:
                load_yaml(path, resolve_func=False, recursive=True)
            except Exception as e:  # whatever the loader raises is what the index skipped the file for
                found[str(path)] = " ".join(f"{type(e).__name__}: {e}".split())
    return found

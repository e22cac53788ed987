"""OmegaConf resolvers, registered before Hydra composes.

Each resolver is a thin call into the one pure function that owns the value
(vocab.padded_vocab_size, precision.resolve_precision), which the plan and the trainer call too.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import OmegaConf

ASSETS = Path(__file__).resolve().parent.parent / "assets"


def _asset(name: str) -> str:
    return str(ASSETS / name)


def _true_vocab(*, _root_) -> int:
    from tinytrain.tokenizer import load_from_config

    return len(load_from_config(_root_.tokenizer))


def _padded_vocab(*, _root_) -> int:
    from tinytrain.vocab import padded_vocab_size

    return padded_vocab_size(_true_vocab(_root_=_root_), _root_.model.vocab_multiple, _root_.parallel.tp)


def _precision(*, _root_) -> str:
    from tinytrain.resolve import precision_decision

    return precision_decision(_root_).value


def _slurm_tasks_per_node(default: int) -> int:
    from tinytrain.slurm import tasks_per_node

    return tasks_per_node(default)


def _run_name() -> str:
    from datetime import datetime

    from tinytrain import slurm

    # Every srun task evaluates this itself: a timestamp could differ between tasks of one job,
    # and a requeued job must find its own directory again.
    return slurm.run_name() or datetime.now().strftime("%Y-%m-%d_%H-%M-%S")


def _run_dir(root: str, name: str) -> str:
    """hydra.run.dir: Hydra creates it before tinytrain runs, so a run.name that would escape
    run.root (`..`, slashes) is refused here, before anything is written."""
    from tinytrain.errors import ConfigError
    from tinytrain.validate import run_name_problem

    problem = run_name_problem(str(name))
    if problem:
        raise ConfigError(problem)
    return f"{root}/{name}"


def register_resolvers() -> None:
    for name, fn in {
        "tt.asset": _asset,
        "tt.true_vocab": _true_vocab,
        "tt.padded_vocab": _padded_vocab,
        "tt.precision": _precision,
        "tt.slurm_tasks_per_node": _slurm_tasks_per_node,
        "tt.run_dir": _run_dir,
    }.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
    if not OmegaConf.has_resolver("tt.run_name"):
        # Cached like Hydra's `now`: one name per process, however often run.name is read.
        OmegaConf.register_new_resolver("tt.run_name", _run_name, use_cache=True)

"""trainer.activation_checkpointing and trainer.compile: the mode a value names, and what the
strategy and the installed torch allow of it.

Both keys took booleans before they took modes; `true`/`false` still mean full/none and
model/none. Their schema type is Any (OmegaConf 2.3 has no Union of bool and Enum), so the value is
read here, once, and a word that names no mode is refused with the modes listed.
"""

from __future__ import annotations

from enum import Enum

from tinytrain.config.schema import Checkpointing, CompileMode
from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.parallel import STRATEGIES, strategy_row

# The old booleans: activation_checkpointing=true recomputed every layer, compile=true compiled the model.
OLD_BOOLEANS = {Checkpointing: (Checkpointing.full, Checkpointing.none), CompileMode: (CompileMode.model, CompileMode.none)}


def read_mode(value, kind: type[Enum]):
    """The member `value` names (a member, its name, or an old boolean), or None."""
    if isinstance(value, kind):
        return value
    if isinstance(value, bool):
        return OLD_BOOLEANS[kind][0 if value else 1]
    if isinstance(value, str):
        word = value.strip().lower()
        if word in ("true", "false"):
            return OLD_BOOLEANS[kind][0 if word == "true" else 1]
        return kind.__members__.get(word)
    return None


def checkpointing_mode(value) -> Checkpointing:
    mode = read_mode(value, Checkpointing)
    if mode is None:
        raise ConfigError(mode_problem("trainer.activation_checkpointing", value, Checkpointing))
    return mode


def compile_mode(value) -> CompileMode:
    mode = read_mode(value, CompileMode)
    if mode is None:
        raise ConfigError(mode_problem("trainer.compile", value, CompileMode))
    return mode


def mode_problem(key: str, value, kind: type[Enum]) -> Problem:
    on, off = OLD_BOOLEANS[kind]
    names = ", ".join(kind.__members__)
    return Problem(key, value, f"names no mode (the modes are {names}; true/false still mean {on.value}/{off.value})", f"use one of {names}, e.g. {key}={on.value}")


def problems(cfg) -> list[Problem]:
    """Unknown modes, and compile where the strategy or this torch cannot."""
    t = cfg.trainer
    found = []
    if read_mode(t.activation_checkpointing, Checkpointing) is None:
        found.append(mode_problem("trainer.activation_checkpointing", t.activation_checkpointing, Checkpointing))
    compiling = read_mode(t.compile, CompileMode)
    if compiling is None:
        found.append(mode_problem("trainer.compile", t.compile, CompileMode))
    elif compiling is not CompileMode.none:
        found += compile_problems(cfg, compiling)
    return found


def compile_problems(cfg, mode: CompileMode, *, dynamo_supported: bool | None = None, backends: list[str] | None = None) -> list[Problem]:
    """`dynamo_supported`, `backends`: this torch's answers (asked here when None; tests stand in for another torch)."""
    row = strategy_row(cfg.parallel.strategy)
    blocker = row.compile_blocks_off if mode is CompileMode.blocks else row.compile_model_off
    if blocker:
        other = CompileMode.model if mode is CompileMode.blocks else CompileMode.blocks
        other_off = row.compile_model_off if mode is CompileMode.blocks else row.compile_blocks_off
        runs = " or ".join(f"parallel={s.value}" for s, r in STRATEGIES.items() if not (r.compile_blocks_off if mode is CompileMode.blocks else r.compile_model_off))
        fix = f"use trainer.compile={other.value}" if not other_off else f"train with {runs}, or trainer.compile=none"
        return [Problem("trainer.compile", mode.value, f"cannot run under parallel={cfg.parallel.name}: {blocker}", fix)]
    if dynamo_supported is None or backends is None:
        import torch._dynamo  # only when compiling: it pulls in sympy and torch.export (~1 s)

        dynamo_supported = torch._dynamo.is_dynamo_supported() if dynamo_supported is None else dynamo_supported
        backends = torch._dynamo.list_backends(exclude_tags=()) if backends is None else backends
    if not dynamo_supported:
        import sys

        import torch

        return [Problem("trainer.compile", mode.value, f"torch {torch.__version__} cannot compile on Python {sys.version_info.major}.{sys.version_info.minor} here (torch._dynamo.is_dynamo_supported() is false)", "use trainer.compile=none, or a Python that this torch compiles on")]
    if cfg.trainer.compile_backend not in backends:
        return [Problem("trainer.compile_backend", cfg.trainer.compile_backend, f"is not a torch.compile backend (this torch has {', '.join(sorted(backends))})", "use trainer.compile_backend=inductor (or aot_eager to trace without generating code)")]
    return []

"""One composition of the config per command instead of Hydra's two.

Before it runs anything, Hydra composes the whole config once only to read `hydra.mode` (RUN or
MULTIRUN; Hydra.get_mode), then composes it again to run: skipping the first takes a `mode=plan` in
a warm process from 0.395 to 0.276 s (benchmarks/plan_composition.py). tinytrain's configs set no `hydra.mode` (tests/unit/config/test_run_mode.py
checks every shipped file), so a command that does not ask for a multirun (`-m`/`--multirun`, a
`hydra.mode` override, or configs from outside the package) runs as Hydra would decide anyway:
when get_mode finds no mode, Hydra runs once and adds `hydra.mode=RUN` itself."""

from __future__ import annotations

import contextlib

# Arguments after which the mode may come from somewhere this module cannot see.
ASKS_FOR_MULTIRUN = ("-m", "--multirun")
OUTSIDE_CONFIGS = ("--config-dir", "-cd", "--config-path", "-cp", "--config-name", "-cn")
MODE_KEYS = ("hydra.mode", "hydra.searchpath")  # also as +key / ++key (add, force-add)


def plainly_a_run(args: list[str]) -> bool:
    """Whether these command-line arguments leave hydra.mode unset, so Hydra runs once."""
    for arg in args:
        key = arg.split("=", 1)[0]
        if arg in ASKS_FOR_MULTIRUN or key in OUTSIDE_CONFIGS or key.lstrip("+") in MODE_KEYS:
            return False
    return True


@contextlib.contextmanager
def composed_once(args: list[str]):
    """Within the block, Hydra's mode-finding composition is skipped for a plain run."""
    if not plainly_a_run(args):
        yield
        return
    from hydra._internal.hydra import Hydra

    original = Hydra.get_mode
    Hydra.get_mode = lambda self, config_name, overrides: None  # Hydra's own answer when no mode is set
    try:
        yield
    finally:
        Hydra.get_mode = original

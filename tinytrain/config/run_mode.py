"""One composition of the config per command instead of Hydra's two.

Before it runs anything, Hydra composes the whole config once only to read `hydra.mode` (RUN or
MULTIRUN; Hydra.get_mode), then composes it again to run: skipping the first takes a `mode=plan` in
a warm process from 0.395 to 0.276 s (benchmarks/plan_composition.py). tinytrain's configs set no `hydra.mode` (tests/unit/config/test_run_mode.py
checks every shipped file), so a command that does not ask for a multirun (`-m`/`--multirun`, a
`hydra.mode` override, or configs from outside the package) runs as Hydra would decide anyway:
when get_mode finds no mode, Hydra runs once and adds `hydra.mode=RUN` itself. A flag of any kind
(argparse takes `--multi` for `--multirun`), or a group option whose file the user added with
`hydra:` settings (an experiment that sweeps), gets Hydra's own two compositions."""

from __future__ import annotations

import contextlib
import re

from tinytrain.config import CONF_DIR

MODE_KEYS = ("hydra.mode", "hydra.searchpath")  # also as +key / ++key (add, force-add)
HYDRA_SETTINGS = re.compile(r"^hydra\s*:", re.MULTILINE)


def plainly_a_run(args: list[str]) -> bool:
    """Whether these command-line arguments leave hydra.mode unset, so Hydra runs once."""
    for arg in args:
        if arg.startswith("-"):  # -m, --multirun, other config folders, and abbreviations of them
            return False
        key, _, option = arg.partition("=")
        key = key.lstrip("+~")
        if key in MODE_KEYS or sets_hydra(key, option):
            return False
    return True


def sets_hydra(group: str, option: str) -> bool:
    """Whether a group option's file sets hydra.* (none shipped does; one a user adds may sweep)."""
    if "/" in group or "." in group or not re.fullmatch(r"[\w.-]+(/[\w.-]+)*", option) or ".." in option:
        return False
    path = CONF_DIR / group / f"{option}.yaml"
    try:
        return bool(HYDRA_SETTINGS.search(path.read_text()))
    except OSError:
        return False


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

"""The sweep launcher's values, checked like cluster.*: `hydra/launcher=submitit_slurm` writes
hydra.launcher.* into the sbatch script submitit submits for a multirun, the same threat as
mode=sbatch's job.sbatch through another door (a newline in hydra.launcher.partition starts a
command, a space in hydra.launcher.account adds an option).

Where each value goes (hydra_submitit_launcher.submitit_launcher and submitit/slurm/slurm.py:
_make_sbatch_string, as installed): every key but submitit_folder and max_num_timeout becomes an
`#SBATCH --key=value` line (shlex-quoted, which sbatch does not read as a shell would: a newline
still ends the line), additional_parameters' keys and values too; `setup` lines run as they are
before the command; `srun_args` and the folder's log paths are quoted into the srun command line.
Numbers and booleans are typed by the launcher's schema. The check runs in the submitting process
when the multirun starts (a Hydra callback, Hydra's one hook before the sweep), before any folder
is made or job submitted.
"""

from __future__ import annotations

import re
import sys

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from tinytrain.cluster.slurm_values import job_name_problems, line_problems, name_problems, path_problems
from tinytrain.errors import ConfigError, Problem

SLURM_LAUNCHER = "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher"
# An sbatch long option's name (additional_parameters' keys become `--<key>`).
OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
# Slurm names: one each, or a comma-separated list for partition.
NAMES = {
    "partition": ("use the partition's name as sinfo lists it, e.g. hydra.launcher.partition=gpu (several, quoted for Hydra: 'hydra.launcher.partition=\"gpu,a800\"')", True),
    "account": ("use the account's name as sacctmgr lists it, e.g. hydra.launcher.account=myproject (one account per job)", False),
    "qos": ("use the QOS's name as sacctmgr show qos lists it, e.g. hydra.launcher.qos=normal", False),
}
# Lines and arguments of commands: any text, on its line.
LINES = {"setup", "teardown", "srun_args"}
NOT_WRITTEN = {"_target_", "max_num_timeout"}


def word_fix(key: str) -> str:
    return f"write {key} as one word without spaces, quotes or control characters, as sbatch takes it (e.g. gres=gpu:8, constraint=a100&ib, exclude=node[01-04])"


def value_problems(key: str, value) -> list[Problem]:
    """One value that reaches an #SBATCH line (a word there) or, for a list, each item."""
    if value is None or isinstance(value, (bool, int, float)):
        return []
    if isinstance(value, (list, tuple)):
        return [p for i, item in enumerate(value) for p in value_problems(f"{key}[{i}]", item)]
    return path_problems(key, str(value), word_fix(key))


def additional_problems(parameters: dict) -> list[Problem]:
    problems = []
    for name, value in parameters.items():
        key = f"hydra.launcher.additional_parameters.{name}"
        if not OPTION_NAME.fullmatch(str(name)):
            problems.append(Problem(key, value, f"{name!r} cannot be an sbatch option name (letters, digits, '_' and '-', starting with a letter)", "name the option as sbatch --help spells it without the dashes, e.g. additional_parameters.mail-type=END"))
        elif value is not True:
            problems += value_problems(key, value)
    return problems


def launcher_problems(launcher: dict) -> list[Problem]:
    """Every hydra.launcher.* value submitit writes into the job script (resolved)."""
    if launcher.get("_target_") != SLURM_LAUNCHER:
        return []  # the basic and submitit_local launchers write no script
    problems = []
    for name, value in launcher.items():
        key = f"hydra.launcher.{name}"
        if name in NOT_WRITTEN or value is None:
            continue
        if name in NAMES:
            fix, allow_list = NAMES[name]
            problems += name_problems(key, value, fix, allow_list=allow_list)
        elif name == "name":
            problems += job_name_problems(str(value), key)
        elif name == "submitit_folder":
            problems += path_problems(key, str(value), "choose a folder path without spaces, quotes or control characters (its log paths go into #SBATCH lines)")
        elif name == "additional_parameters":
            problems += additional_problems(dict(value))
        elif name in LINES:
            items = value if isinstance(value, list) else [value]
            problems += [p for i, item in enumerate(items) for p in line_problems(f"{key}[{i}]", str(item), "write each entry on one line (no newline, carriage return or tab); list several as separate entries")]
        else:
            problems += value_problems(key, value)
    return problems


class CheckLauncherValues(Callback):
    """Refuses a multirun whose launcher would write an unsafe value, before anything is submitted."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        launcher = OmegaConf.to_container(config.hydra.launcher, resolve=True)
        problems = launcher_problems(launcher)
        if problems:
            # Hydra turns an exception in a callback into a warning and submits anyway (its
            # Callbacks._notify): stop here as the CLI stops on a ConfigError, exit 2.
            print(ConfigError(problems).render(), file=sys.stderr, flush=True)
            sys.exit(2)

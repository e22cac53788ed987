"""What may reach a generated Slurm script: values checked against what Slurm accepts for each
field, so a value is data in its `#SBATCH` line and can never become a second option, end the
`#SBATCH` block early, or run as a command.

sbatch reads `#SBATCH` lines up to the first command and splits each on whitespace: a space in
`cluster.account='acct --nodes=64'` adds `--nodes=64`, a newline in `run.name` ends the comment or
directive and starts a command. Slurm's own names (partitions, accounts) are letters, digits,
`_`, `.` and `-`; job names and paths are free text in Slurm but here must stay on their line and
in one word. The command line's overrides are shell-quoted where the script runs them
(sbatch.render); here they are refused only where no quoting helps: a newline or other control
character would leave the `# Written by tinytrain from:` comment that echoes them.
"""

from __future__ import annotations

import re

from tinytrain.errors import Problem

# Slurm partition / account names (a partition may be a comma-separated list: --partition=a,b).
SLURM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*")
# A job name: one word on one line, without shell or sbatch-quote characters, not an option.
JOB_NAME = re.compile(r"[A-Za-z0-9_.+@:=,/][A-Za-z0-9_.+@:=,/\-]*")
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Characters a path in an #SBATCH line cannot hold: whitespace splits the line, quotes are
# sbatch's own, control characters end it.
UNSAFE_IN_PATH = re.compile(r"[\s\"'\\\x00-\x1f\x7f]")


def describe(text: str) -> str:
    """What is wrong with a value, in words (the first offending character named)."""
    if CONTROL.search(text):
        return "holds a newline or other control character, which would end its line of the script and start a command"
    if re.search(r"\s", text):
        return "holds whitespace: sbatch splits #SBATCH lines on it, so the rest would become another option"
    if text.startswith("-"):
        return "starts with '-': it would read as an option"
    return "holds characters Slurm does not accept there"


def name_problems(key: str, value, fix: str, allow_list: bool = False) -> list[Problem]:
    """A Slurm partition or account name (null: not written)."""
    if value is None:
        return []
    text = str(value)
    parts = text.split(",") if allow_list else [text]
    if all(SLURM_NAME.fullmatch(p) for p in parts):
        return []
    return [Problem(key, text, f"is not a Slurm name ({describe(text)}; Slurm names are letters, digits, '_', '.', '-')", fix)]


def job_name_problems(name: str, key: str = "run.name") -> list[Problem]:
    if JOB_NAME.fullmatch(name):
        return []
    return [Problem(key, name, f"cannot be a Slurm job name ({describe(name)})", f"use letters, digits and . _ - / only, e.g. {key}=my_run")]


def path_problems(key: str, path: str, fix: str) -> list[Problem]:
    if not UNSAFE_IN_PATH.search(path) and not path.startswith("-"):
        return []
    return [Problem(key, path, f"cannot go into an #SBATCH line ({describe(path)})", fix)]


def time_problems(value: str) -> list[Problem]:
    """The format itself is checked by sbatch.slurm_time_seconds; here what would leave the line."""
    if CONTROL.search(value) or re.search(r"\s", value):
        return [Problem("cluster.time", value, describe(value), "write the limit alone, e.g. cluster.time=24:00:00")]
    return []


def override_problems(overrides: list[str], reported: set[str] = frozenset()) -> list[Problem]:
    """Overrides the script echoes in a comment and passes to srun: quoting makes every character
    data except the ones that end a line. `reported`: keys whose value was already refused."""
    problems = []
    for o in overrides:
        key, _, value = o.partition("=")
        key = key.lstrip("+~")
        if CONTROL.search(o) and key not in reported:
            problems.append(Problem(key, value, "holds a newline or other control character; the job script would carry it out of its comment line", "write the value on one line (no newline, carriage return or tab)"))
    return problems


def line_problems(key: str, value: str, fix: str) -> list[Problem]:
    """A value that is a whole line of the script or one quoted word of a command (a setup line,
    an srun argument): any text, but on its line."""
    if not CONTROL.search(value):
        return []
    return [Problem(key, value, describe(value), fix)]


def comment_safe(text: str) -> str:
    """`text` for a `#` comment line: any control character shown as an escape, never a line end."""
    return CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def script_value_problems(cfg, overrides: list[str], run_dir: str, workdir: str) -> list[Problem]:
    """Every value cluster/sbatch.py writes into job.sbatch, checked before anything is written."""
    c = cfg.cluster
    problems = (
        job_name_problems(str(cfg.run.name))
        + name_problems("cluster.partition", c.partition, "use the partition's name as sinfo lists it, e.g. cluster.partition=gpu (several, quoted for Hydra: 'cluster.partition=\"gpu,a800\"')", allow_list=True)
        + name_problems("cluster.account", c.account, "use the account's name as sacctmgr lists it, e.g. cluster.account=myproject (one account per job)")
        + time_problems(str(c.time))
        + path_problems("hydra.run.dir", run_dir, "choose a run directory path without spaces, quotes or control characters (run.root=<folder>, run.name=<name>)")
        + path_problems("working directory", workdir, "run mode=sbatch from a folder whose path has no spaces, quotes or control characters (the job starts there)")
    )
    return problems + override_problems(overrides, {p.key for p in problems})


# A value Hydra's override grammar reads as it is, unquoted (a path of these characters).
HYDRA_PLAIN = re.compile(r"[A-Za-z0-9_./+\-:@%]*")


def hydra_value(value: str) -> str:
    """`value` as Hydra's command-line grammar reads it back unchanged: quoted where it holds `=`,
    `,`, spaces, brackets or quotes (`hydra.run.dir=runs/v=2` was refused when the job started).
    Inside quotes Hydra unescapes a backslash only before a quote or at the end."""
    if HYDRA_PLAIN.fullmatch(value):
        return value
    escaped = re.sub(r"(\\+)(?='|$)", lambda m: m.group(1) * 2, value).replace("'", "\\'")
    return f"'{escaped}'"


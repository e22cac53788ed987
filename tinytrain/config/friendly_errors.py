"""Turns Hydra / OmegaConf composition errors into one paragraph: key, value, fix.

Anything not recognised here is a bug, not a user error, and keeps its traceback.
"""

from __future__ import annotations

import dataclasses
import difflib
import errno
import os
import re
from pathlib import Path

from tinytrain.config import CONF_DIR
from tinytrain.errors import ConfigError

HINT = "(set HYDRA_FULL_ERROR=1 for the traceback)"
# Hydra's answer to `+key=value` where the key exists.
APPEND_TO_EXISTING = re.compile(r"Could not append to config\. An item is already at '([\w.]+)'")


def causes(e: BaseException):
    """`e` and the exceptions it was raised from or while handling, outermost first."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        yield e
        e = e.__cause__ or e.__context__


def _did_you_mean(word: str, options) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" Did you mean '{close[0]}'?" if close else ""


def _override_for(full_key: str, argv: list[str]) -> str | None:
    # The last one: Hydra applies a key given twice (a sweep agent appends its values) as the last.
    for arg in reversed(argv):
        if arg.lstrip("+~").split("=", 1)[0] == full_key:
            return arg
    # OmegaConf names a key inside a list of dicts (data.sources=[{path: a, weight: x}]) from the
    # entry down (data.stages=[{weights: {a: x}}] gives weights.a): found by its leaf.
    leaf = full_key.rsplit(".", 1)[-1]
    for arg in reversed(argv):
        if "=" in arg and re.search(rf"[{{,]\s*{re.escape(leaf)}\s*:", arg.split("=", 1)[1]):
            return arg
    return None


def _schema_fields(full_key: str) -> list[str]:
    """Valid keys next to `full_key` (e.g. model.hiden_size -> ModelConfig's fields)."""
    node = _schema_node(full_key.split(".")[:-1])
    return [f.name for f in dataclasses.fields(node)] if node is not None else []


def _schema_node(parts: list[str]):
    """The schema dataclass at a dotted path; a list of entries (data.sources) gives its entry's."""
    import typing

    from tinytrain.config.schema import Config

    node = Config
    for part in parts:
        hints = typing.get_type_hints(node)
        if part not in hints:
            return None
        node = hints[part]
        if typing.get_origin(node) is list:
            (node,) = typing.get_args(node)
        if not dataclasses.is_dataclass(node):
            return None
    return node


def _raised_in(e: BaseException, function: str) -> bool:
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name == function:
            return True
        tb = tb.tb_next
    return False


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0]


# errno -> the fix, {path} being the file or folder that failed.
OS_ERROR_FIXES = {
    errno.ENOSPC: "free space on the disk holding {path} (df -h {parent}), or point that output at another disk",
    errno.EDQUOT: "free space in your quota on the disk holding {path}, or point that output at another disk",
    errno.EACCES: "make {path} accessible to this user (ls -ld {parent}), or choose a path you can write to",
    errno.EPERM: "make {path} accessible to this user (ls -ld {parent}), or choose a path you can write to",
    errno.EROFS: "{path} is on a read-only filesystem: choose a path on a writable disk",
    errno.ENOENT: "check that {path} exists (a file or folder it names may have been moved or deleted)",
    errno.ENOTDIR: "a file is in the way of a folder on the path {path}: move it away, or choose another path",
    errno.EISDIR: "{path} is a folder where a file is expected: give the file's path",
    errno.EEXIST: "{path} already exists as something else: move it away, or choose another path",
}


def os_error_message(e: OSError, argv: list[str]) -> str:
    """An OSError raised by a stage: the file, the operation, and a fix for that errno, with the
    override that named the path when one did."""
    path = e.filename or _open_file(e) or "a file"
    operation = _operation(e)
    key = next((a for a in argv if "=" in a and e.filename and a.split("=", 1)[1] and str(e.filename).startswith(a.split("=", 1)[1].strip("'\""))), None)
    fix = OS_ERROR_FIXES.get(e.errno, "check the path and the disk, then run again").format(path=path, parent=Path(str(path)).parent)
    named = f" (from {key})" if key else ""
    return f"tinytrain: {operation} failed on {path}{named}: {e.strerror or e}. Fix: {fix}. {HINT}"


def _open_file(e: BaseException) -> str | None:
    """The file a write, flush or close failed on (those OSErrors carry no filename: "close in fit
    failed on a file"): an open file object of the innermost frame that its failing line names
    (`f.write(...)`, or `with ... as f:` for the close). None where none is: better "a file" than
    another file, on another disk."""
    import io
    import linecache
    import re

    tb = e.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    frame = tb.tb_frame
    line = linecache.getline(frame.f_code.co_filename, tb.tb_lineno)
    for var, value in frame.f_locals.items():
        # A file object's name; fsspec's local file (Lightning's CSV logger writes through it) has a path.
        name = (getattr(value, "name", None) or getattr(value, "path", None)) if isinstance(value, io.IOBase) else None
        if isinstance(name, str) and name and re.search(rf"\b{re.escape(var)}\b", line):
            return name
    return None


def _operation(e: BaseException) -> str:
    """`mkdir in export_folder (tinytrain/checkpoint/export.py)`: the innermost call (the
    operation) and the innermost tinytrain function that made it."""
    frames = []
    tb = e.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame.f_code)
        tb = tb.tb_next
    ours = [c for c in frames if f"{os.sep}tinytrain{os.sep}" in c.co_filename]
    if not ours:
        return "a file operation"
    where = f"{ours[-1].co_name} (tinytrain/{ours[-1].co_filename.rsplit(os.sep + 'tinytrain' + os.sep, 1)[1]})"
    return where if frames[-1] is ours[-1] else f"{frames[-1].co_name} in {where}"


def friendly_message(e: BaseException, argv: list[str]) -> str | None:
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
        SearchPathException,
    )
    from omegaconf.errors import InterpolationResolutionError

    chain = list(causes(e))
    for err in chain:
        if isinstance(err, ConfigError):
            return f"{err.render()}\n{HINT}"
    for err in chain:
        if isinstance(err, InterpolationResolutionError):
            return interpolation_message(err, argv)
    head = chain[0]
    if isinstance(head, ValueError) and "Config group override must be a string" in str(head):
        return null_group_message(argv)
    if isinstance(head, ValueError) and str(head).startswith("Only one of --run, --multirun, --cfg"):
        return one_action_message(argv)
    # Hydra creates the run directory and opens its log (a ValueError "Unable to configure handler
    # 'file'" around the OSError) before tinytrain runs (before hydra_main): a regular file in the
    # way, a read-only or full disk, no permission.
    in_setup = _raised_in(head, "run_job") and not _raised_in(head, "hydra_main")
    opened = isinstance(head, ValueError) and "configure handler" in str(head)
    setup = head if isinstance(head, OSError) else next((err for err in chain if isinstance(err, OSError)), None) if opened else None
    if setup is not None and in_setup:
        head = setup
        where = head.filename or "the run directory"
        what = "cannot write its log in the run directory" if opened else "cannot create the run directory"
        return (
            f"tinytrain: configuration error: hydra.run.dir: {what} {where}: {head.strerror or head}. "
            f"Fix: choose a writable folder with run.root=<folder> (or hydra.run.dir=<folder>), and move away any regular file on that path. {HINT}"
        )
    if isinstance(head, MissingConfigException) and head.missing_cfg_file and "/" in head.missing_cfg_file:
        group, option = head.missing_cfg_file.rsplit("/", 1)
        # Hydra leaves the options out for a list of options (logger=[csv,mlflow]): the shipped ones.
        options = head.options or sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        return (
            f"tinytrain: configuration error: {group}={option}: no such option in config group '{group}'."
            f"{_did_you_mean(option, options)} Available: {', '.join(options)}. "
            f"Fix: pick one of those, or add {group}/{option}.yaml to tinytrain/conf/ or to your own --config-dir. {HINT}"
        )
    if isinstance(head, OverrideParseException):
        return f"tinytrain: could not parse the command-line overrides: {_first_line(str(head))}. Fix: write overrides as key=value; quote values with special characters inside the list, and the whole override for the shell: 'tokenizer.add_special_tokens=[\"<|im_start|>\",\"<|im_end|>\"]'. {HINT}"
    if isinstance(head, ConfigCompositionException):
        return composition_message(head, chain, argv)
    if isinstance(head, SearchPathException):
        return f"tinytrain: configuration error: --config-dir / hydra.searchpath: {_first_line(str(head))}. Fix: point it at an existing folder of config groups (model/, data/, ...). {HINT}"
    if isinstance(head, OSError):  # after Hydra's own errors (MissingConfigException is an IOError)
        return os_error_message(head, argv)
    return None


MISSING_KEY = re.compile(r"Interpolation key '([\w.]+)' not found")


# Hydra's flags that each say what the command does; only one may be given.
ACTIONS = {"-r": "--run", "--run": "--run", "-m": "--multirun", "--multirun": "--multirun", "-c": "--cfg", "--cfg": "--cfg", "-i": "--info", "--info": "--info", "-sc": "--shell-completion", "--shell-completion": "--shell-completion"}


def one_action_message(argv: list[str]) -> str:
    given = [f"{arg} ({ACTIONS[arg]})" if ACTIONS[arg] != arg else arg for arg in argv if arg in ACTIONS]
    resolve = " (--resolve has no short form: -r is --run)" if "-r" in argv and any(ACTIONS.get(arg) == "--cfg" for arg in argv) else ""
    return f"tinytrain: {', '.join(given) or 'the flags given'}: Hydra takes one of --run, --multirun, --cfg, --info and --shell-completion per command{resolve}. Fix: keep one of them. {HINT}"


def _printing_hydra_resolved(argv: list[str]) -> bool:
    """`--cfg hydra --resolve` resolves Hydra's settings alone, without the run's config they refer to."""
    shown = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg in ("-c", "--cfg")] + [arg.split("=", 1)[1] for arg in argv if arg.startswith("--cfg=")]
    return "--resolve" in argv and "hydra" in shown


def interpolation_message(err, argv: list[str]) -> str:
    """A `${...}` that cannot be resolved: one of the user's (a key that is not there, an unset
    variable, a value of the wrong type), or one of tinytrain's after a '~' removed what it reads."""
    full_key = getattr(err, "full_key", None) or "?"
    said = _first_line(str(err))
    missing = MISSING_KEY.search(said)
    if missing and _printing_hydra_resolved(argv):
        return (
            f"tinytrain: --cfg hydra --resolve: Hydra's settings refer to the run's config (hydra.run.dir is ${{run.root}}/${{run.name}}), "
            f"which --cfg hydra resolves without ({missing.group(1)} is not found). Fix: --cfg all --resolve prints Hydra's settings resolved with the run's (or --cfg hydra, unresolved). {HINT}"
        )
    if missing:
        parts = missing.group(1).split(".")
        removed = [f"~{'.'.join(parts[:i])}" for i in range(1, len(parts) + 1)]
        deleting = next((arg for arg in argv if arg in removed), None)
        if deleting:
            return f"tinytrain: configuration error: {deleting}: removes {missing.group(1)}, which {full_key} refers to. Fix: drop '{deleting}'; to change it, set {deleting[1:]}=<value>. {HINT}"
    # The key's own override, or one whose ${...} the message names (hydra.run.dir fails on run.name's).
    named = re.findall(r"'([^']+)'", said)
    override = _override_for(full_key, argv) or next((arg for arg in argv if "${" in arg and any(n in arg for n in named)), None)
    if override is None:  # set by a config file or a resolver's environment variable, not on this command line
        return f"tinytrain: configuration error: {full_key}: cannot resolve it: {said}. Fix: give {full_key} a value that resolves (set it on the command line, or the variable or key it refers to). {HINT}"
    return (
        f"tinytrain: configuration error: {override}: cannot resolve {full_key}: {said}. Fix: refer to a key that exists "
        f"(${{trainer.micro_batch_size}}, or ${{.key}} within its own node) or to an environment variable that is set "
        f"(${{oc.env:VAR,default}} gives a default), of the key's type. {HINT}"
    )


def null_group_message(argv: list[str]) -> str:
    """`model=null`: Hydra's ValueError about a config group override's type."""
    groups = sorted(p.name for p in CONF_DIR.iterdir() if p.is_dir())
    given = next((arg for arg in argv if arg.split("=", 1)[0].lstrip("+~") in groups and arg.split("=", 1)[-1] in ("null", "~")), None)
    group = given.split("=", 1)[0].lstrip("+~") if given else None
    options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml")) if group else []
    available = f" Available: {', '.join(options)}." if options else ""
    return f"tinytrain: configuration error: {given or 'a config group set to null'}: a config group takes one of its options, not null.{available} Fix: pick one of those. {HINT}"


def composition_message(head, chain: list, argv: list[str]) -> str:
    """Hydra could not compose the config: a '+' on an existing key, an unknown key, a wrong value."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ValidationError

    appended = APPEND_TO_EXISTING.search(str(head))
    if appended:
        key = appended.group(1)
        override = _override_for(key, argv) or f"+{key}=..."
        return (
            f"tinytrain: configuration error: {override}: {key} is already a config key, and '+' adds a new one. "
            f"Fix: drop the '+': {override.lstrip('+')} {HINT}"
        )
    for err in chain:
        full_key = getattr(err, "full_key", None)
        if not full_key:
            continue
        override = _override_for(full_key, argv) or full_key
        if isinstance(err, (ConfigAttributeError, ConfigKeyError)):
            valid, what = _schema_fields(full_key), f"'{full_key}' is not a config key"
            named = override.lstrip("+~").split("=", 1)[0]
            if "." not in full_key and named != full_key:
                # A key inside a list entry (data.sources=[{pth: ...}]): OmegaConf names the leaf alone.
                node = _schema_node(named.split("."))
                valid = [f.name for f in dataclasses.fields(node)] if node is not None else []
                what = f"'{full_key}' is not a key of a {named} entry"
            hint = _did_you_mean(full_key.rsplit(".", 1)[-1], valid)
            listing = f" Valid keys there: {', '.join(valid)}." if valid else ""
            return f"tinytrain: configuration error: {override}: {what}.{hint}{listing} Fix: correct the key's spelling. {HINT}"
        if isinstance(err, ValidationError) and "expected one of" in err.msg:
            return f"tinytrain: configuration error: {override}: wrong value for '{full_key}': {_first_line(err.msg)}. Fix: use one of those values. {HINT}"
        if isinstance(err, ValidationError):
            return f"tinytrain: configuration error: {override}: wrong value for '{full_key}': {_first_line(err.msg)}. Fix: give {full_key} a value of the right type. {HINT}"
    return hydra_message(head, chain)


OMEGACONF_DETAIL = re.compile(r"(full_key|reference_type|object_type|object_type=\w+)\s*[:=]")


def hydra_message(head, chain: list) -> str:
    """An error of Hydra's own that names no config key: its whole text (an ambiguous value's
    fixes are on its later lines) and the cause it wraps ('~' on a schema key)."""
    lines = [line.strip() for e in chain for line in str(e).strip().splitlines()]
    said = " ".join(line for line in lines if line and not OMEGACONF_DETAIL.match(line))
    if "does not support deletion" in said or "Could not delete from config" in said:
        fix = "'~' removes a key, and tinytrain's keys are its schema's: give the key a value instead (null where it takes none)"
    else:
        fix = "write the override as the message above says"
    return f"tinytrain: configuration error: {said.rstrip('.')}. Fix: {fix}. {HINT}"

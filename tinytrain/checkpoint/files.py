"""Checkpoint files on disk: their names, atomic publication, listing and pruning.

A checkpoint is written under a temp name in its own folder (`<name>.tmp-<pid>`) and renamed onto
its final name when complete (`os.replace` is atomic within one filesystem), then the folder is
fsynced so the rename survives a crash. A file with a final name is therefore complete; a killed
writer leaves only a temp file, which resume ignores and removes (not one whose writer still
runs). Step checkpoints are named `step<N:07d>.ckpt` (a file, or a folder: formats.py knows each
format).

No Lightning here: `mode=plan` lists checkpoints to show what it would resume from.
"""

from __future__ import annotations

import csv
import glob
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from tinytrain.cluster.local_process import running, started_at

TEMP_MARK = ".tmp-"
TEMP_OWNER = re.compile(re.escape(TEMP_MARK) + r"(\d+)")
STEP_NAME = re.compile(r"^step(\d+)\.ckpt$")
UNIVERSAL_SUFFIX = ".universal"  # DeepSpeed's universal copy of a step folder (checkpoint/universal.py)


def universal_path(checkpoint: Path) -> Path:
    return checkpoint.with_name(checkpoint.name.removesuffix(".ckpt") + UNIVERSAL_SUFFIX)


def temp_path(final: Path, pid: int | None = None) -> Path:
    """Where `final` is written before it is complete: the same folder, so the rename stays atomic."""
    return final.with_name(f"{final.name}{TEMP_MARK}{os.getpid() if pid is None else pid}")


def is_temp(path: Path) -> bool:
    return TEMP_MARK in path.name


def temp_writer_alive(path: Path) -> bool:
    """Whether the process named by a temp name (`<name>.tmp-<pid>...`) still runs on this host and
    is not this one: the file is being written (a second export into the same folder, an average
    beside a resumed run), not left by a killed one. A process that started after the temp was
    last written holds a reused pid, not the writer's. A writer on another node of a shared
    filesystem is not seen, and its temp counts as left behind."""
    m = TEMP_OWNER.search(path.name)
    if m is None or int(m.group(1)) == os.getpid():
        return False
    pid = int(m.group(1))
    if not running(pid):
        return False
    try:
        written = path.stat().st_mtime
    except OSError:
        return False
    started = started_at(pid)
    return started is None or started <= written + 2  # btime is whole seconds


def temp_siblings(final: Path) -> list[Path]:
    """The temp files and folders written for `final` beside it (`<name>.tmp-<pid>...`), any writer's."""
    final = Path(final)
    if not final.parent.is_dir():
        return []
    return sorted(final.parent.glob(f"{glob.escape(final.name)}{TEMP_MARK}*"))


def replace_text(final: Path, write: Callable[[TextIO], None], newline: str | None = None) -> None:
    """`final` written whole by `write(file)` beside itself and renamed over it, fsynced with its
    folder: a failure (a full disk's included) leaves the old file as it was and no temp file."""
    tmp = temp_path(final)
    try:
        with tmp.open("w", encoding="utf-8", newline=newline) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_directory(final.parent)


def replace_csv(final: Path, fieldnames: list[str], rows: list[dict]) -> None:
    """A CSV file of `rows` under a header of `fieldnames`, replaced whole (replace_text)."""

    def write(f: TextIO) -> None:
        writer = csv.DictWriter(f, fieldnames=fieldnames)
        writer.writeheader()
        writer.writerows(rows)

    replace_text(final, write, newline="")


def fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def publish_directory(tmp: Path, final: Path) -> None:
    """Move a completely written checkpoint folder onto its final name. A folder cannot be renamed
    over a non-empty one, so an existing one is moved aside first and deleted after."""
    old = None
    if final.exists():
        old = temp_path(final).with_name(temp_path(final).name + "-old")
        os.replace(final, old)
    os.replace(tmp, final)
    fsync_directory(final.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def step_checkpoint_name(step: int) -> str:
    return f"step{step:07d}.ckpt"


def step_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete step checkpoint, newest first; temp files never match."""
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir() if (m := STEP_NAME.match(p.name))]
    return sorted(found, reverse=True)


def prune(directory: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest `keep_last` step checkpoints (and a universal copy made of one to
    resume from); returns what was deleted."""
    from tinytrain.checkpoint.formats import format_of  # (it imports torch: listing and naming need not)

    removed = [path for _, path in step_checkpoints(directory)[keep_last:]]
    for path in removed:
        for gone in (path, universal_path(path)):
            format_of(gone).remove(gone)
    return removed

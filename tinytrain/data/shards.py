"""Shard files as corpora ship them: which file names are read and how, and how data.path (a file,
a folder read recursively, or a glob) becomes a sorted list of shards.

The single table of suffixes (FORMATS) is what data/sources.py (reading and checking) and data/mixture.py
read. `.json.gz` is JSON Lines (Dolma ships them so). Compressed shards are decompressed while
streaming, never whole: memory per reader is a buffer, whatever the shard's size. A truncated or
corrupt compressed shard raises ShardDamaged, which readers turn into a bad record naming the file
and the line reached (data.bad_records).
"""

from __future__ import annotations

import glob
import gzip
import io
import zlib
from dataclasses import dataclass
from pathlib import Path

from tinytrain.config.schema import DataSource
from tinytrain.errors import ConfigError, Problem

READ_BYTES = 1 << 20


@dataclass(frozen=True)
class Format:
    kind: DataSource  # the reader: text, jsonl or parquet
    compression: str | None  # None, "gzip" or "zstd"


FORMATS: dict[str, Format] = {
    ".txt": Format(DataSource.text, None),
    ".txt.gz": Format(DataSource.text, "gzip"),
    ".txt.zst": Format(DataSource.text, "zstd"),
    ".jsonl": Format(DataSource.jsonl, None),
    ".jsonl.gz": Format(DataSource.jsonl, "gzip"),
    ".jsonl.zst": Format(DataSource.jsonl, "zstd"),
    ".json.gz": Format(DataSource.jsonl, "gzip"),
    ".json.zst": Format(DataSource.jsonl, "zstd"),
    ".parquet": Format(DataSource.parquet, None),
}
# Longest first, so ".jsonl.gz" wins over a shorter match.
_BY_LENGTH = sorted(FORMATS, key=len, reverse=True)
FILE_SOURCES = (DataSource.text, DataSource.jsonl, DataSource.parquet)
DATA_SUFFIXES = {".txt", ".jsonl", ".json", ".parquet"}
READABLE = ", ".join(FORMATS)
GLOB_CHARS = set("*?[")
DECOMPRESS_FIX = "decompress it, or recompress it as .gz or .zst"


class ShardDamaged(Exception):
    """A compressed shard ends early or holds bytes its codec rejects."""


def shard_format(path: Path, fallback: DataSource | None = None) -> Format | None:
    """The format a file name says; else `fallback` uncompressed (a single file named explicitly)."""
    name = path.name.lower()
    for suffix in _BY_LENGTH:
        if name.endswith(suffix):
            return FORMATS[suffix]
    return Format(fallback, None) if fallback in FILE_SOURCES else None


def unread_compression(path: Path) -> str | None:
    """The compression suffix of a data file tinytrain cannot decompress ("x.jsonl.bz2" -> ".bz2")."""
    suffixes = [s.lower() for s in path.suffixes]
    if len(suffixes) >= 2 and suffixes[-2] in DATA_SUFFIXES and "".join(suffixes[-2:]) not in FORMATS:
        return suffixes[-1]
    return None


def is_glob(path: str) -> bool:
    return bool(GLOB_CHARS & set(path)) and not Path(path).exists()


def list_shards(path: str, key: str, fallback: DataSource) -> list[Path]:
    """The shards `path` names, sorted: the file itself, a folder's shards (recursive, hidden files
    and folders skipped) or a glob's matches (`**` reaches subfolders). ConfigError when none is readable or one
    is compressed in a way tinytrain does not read."""
    if is_glob(path):
        candidates = sorted(Path(m) for m in glob.glob(path, recursive=True) if Path(m).is_file())
        if not candidates:
            raise ConfigError(Problem(key, path, "the glob matches no files", "check the pattern (quote it so the shell leaves it alone; ** reaches subfolders)"))
        where = "the glob matches"
    else:
        p = Path(path)
        if not p.exists():
            raise ConfigError(Problem(key, path, "no such file or folder", f"point {key} at a file, a folder or a glob of shards ({READABLE})"))
        if p.is_file():
            if unread_compression(p) or shard_format(p, fallback) is None:
                _refuse_compression(key, path, p)
            return [p]
        # Hidden files and anything in a hidden folder (.ipynb_checkpoints, .git) skipped, as a glob does.
        candidates = sorted(f for f in p.rglob("*") if f.is_file() and not any(part.startswith(".") for part in f.relative_to(p).parts))
        where = "folder holds"
    for f in candidates:
        if unread_compression(f):
            _refuse_compression(key, path, f)
    shards = [f for f in candidates if shard_format(f) is not None]
    if not shards:
        raise ConfigError(Problem(key, path, f"{where} no readable shard (read: {READABLE})", f"point {key} at a file, a folder or a glob of such shards"))
    return shards


def _refuse_compression(key: str, path: str, f: Path) -> None:
    suffix = unread_compression(f) or f.suffix or "(none)"
    raise ConfigError(Problem(key, path, f"{f}: compression {suffix} is not read (read: {READABLE})", DECOMPRESS_FIX))


def open_binary(f: Path, fmt: Format) -> io.BufferedReader:
    """A buffered binary stream of the shard's decompressed bytes; damage raises ShardDamaged."""
    raw = f.open("rb")
    if fmt.compression is None:
        return raw
    if fmt.compression == "gzip":
        return io.BufferedReader(_Guarded(gzip.GzipFile(fileobj=raw, mode="rb"), raw), READ_BYTES)
    return io.BufferedReader(_ZstdReader(raw), READ_BYTES)


class _Guarded(io.RawIOBase):
    """Turns gzip's EOFError / BadGzipFile / zlib.error into ShardDamaged."""

    def __init__(self, inner, raw):
        self.inner, self.raw = inner, raw

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            data = self.inner.read1(len(buffer))
        except (EOFError, OSError, zlib.error) as e:
            raise ShardDamaged(f"{type(e).__name__}: {e}") from e
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self.inner.close()
        self.raw.close()
        super().close()


class _ZstdReader(io.RawIOBase):
    """Zstandard frames one after another; a frame cut short is damage (zstandard's own stream
    reader returns the bytes it has and ends quietly)."""

    def __init__(self, raw):
        import zstandard

        self.raw = raw
        self.zstd = zstandard
        self.obj = zstandard.ZstdDecompressor().decompressobj()
        self.pending = b""
        self.in_frame = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self.pending:
            chunk = self.raw.read(READ_BYTES)
            if not chunk:
                if self.in_frame:
                    raise ShardDamaged("the compressed stream ends inside a frame (truncated)")
                return 0
            self.pending = self._feed(chunk)
        n = min(len(buffer), len(self.pending))
        buffer[:n] = self.pending[:n]
        self.pending = self.pending[n:]
        return n

    def _feed(self, chunk: bytes) -> bytes:
        out = []
        while chunk:
            try:
                out.append(self.obj.decompress(chunk))
            except self.zstd.ZstdError as e:
                raise ShardDamaged(f"zstandard: {e}") from e
            self.in_frame = not self.obj.eof
            chunk = self.obj.unused_data if self.obj.eof else b""
            if self.obj.eof:
                self.obj = self.zstd.ZstdDecompressor().decompressobj()
        return b"".join(out)

    def close(self) -> None:
        self.raw.close()
        super().close()

"""Where documents and records come from: shards of text, JSON Lines (plain, .gz, .zst) and Parquet,
Hugging Face datasets, and the embedded pydoc corpus.

A file source's path is a file, a folder (recursive) or a glob; its shards may mix formats, each read
by its own suffix (data/shards.py). Readers stream with constant memory whatever a shard's size: text
in 1 MiB reads split at blank lines, JSON Lines line by line, Parquet in record batches.
`documents()` yields pretraining texts, `records()` yields SFT records (dicts), each with its location
("data.jsonl.zst:12", "part-0.parquet row 7") so a bad one can be named. Unusable records and damaged
compressed shards go through BadRecords (data.bad_records). A source's fingerprint is what the token
store is keyed by: its kind, its files with size and modification time, and the options that change
what is read.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tinytrain.config.schema import BadRecordPolicy, DataSource, TextSplit
from tinytrain.data import shards
from tinytrain.data.bad_records import BadRecords
from tinytrain.data.shards import ShardDamaged
from tinytrain.errors import ConfigError, Problem

RECORD_SOURCES = (DataSource.jsonl, DataSource.parquet, DataSource.hf)  # where SFT records come from
# Also splits "\r\n\r\n" (the stray "\r" is stripped with the block); a leading "\r?" would make
# the regex engine ~5x slower on large files. On bytes: the separator is ASCII, never inside a
# UTF-8 sequence.
BLANK_LINE = re.compile(rb"\n[ \t]*\r?\n")
DAMAGED_FIX = "download or copy the shard again (a .gz/.zst shard cut short fails its own check: gzip -t / zstd -t)"
HF_SAVED_MARKERS = ("dataset_info.json", "dataset_dict.json", "state.json")
BATCH_ROWS = 4096


@dataclass(frozen=True)
class Source:
    kind: DataSource
    path: str | None
    key: str  # the config key that names it, for messages: data.path or data.val_path
    text_split: TextSplit
    text_field: str
    hf_split: str
    bad_records: BadRecordPolicy

    @classmethod
    def from_config(cls, data_cfg, validation: bool = False) -> Source:
        return cls(
            kind=data_cfg.source,
            path=data_cfg.val_path if validation else data_cfg.path,
            key="data.val_path" if validation else "data.path",
            text_split=data_cfg.text_split,
            text_field=data_cfg.text_field,
            hf_split=data_cfg.hf_split,
            bad_records=data_cfg.bad_records,
        )

    def describe(self) -> str:
        return "pydoc_data.topics" if self.kind == DataSource.pydoc else f"{self.kind.value}:{self.path}"


def files(src: Source) -> list[Path]:
    """The shards of a text/jsonl/parquet source, sorted (data/shards.py: a file, a folder, a glob)."""
    return shards.list_shards(src.path, src.key, src.kind)


def file_stats(listed: list[Path]) -> list[tuple[str, int, int]]:
    """(resolved path, size, mtime) per file: what a store or a part of one is keyed by."""
    out = []
    for f in listed:
        st = f.stat()
        out.append((str(f.resolve()), st.st_size, st.st_mtime_ns))
    return out


def fingerprint(src: Source) -> str:
    """Changes whenever what the source reads would change (files, their size or mtime, options)."""
    payload: dict = {"kind": src.kind.value, "bad_records": src.bad_records.value}
    if src.kind == DataSource.pydoc:
        from tinytrain.data.corpus import pydoc_documents

        payload["content"] = hashlib.sha256("\x00".join(pydoc_documents()).encode()).hexdigest()
    elif src.kind == DataSource.hf:
        ds = load_hf(src)
        payload.update(path=src.path, split=src.hf_split, dataset=ds._fingerprint)  # datasets' own content fingerprint
    else:
        payload["files"] = file_stats(files(src))
    if src.kind == DataSource.text:
        payload["text_split"] = src.text_split.value
    if src.kind != DataSource.pydoc:
        # The field records are read by (a folder may mix .txt and records): another field is other text.
        payload["text_field"] = src.text_field
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def documents(src: Source, bad: BadRecords, field: str | None = None) -> Iterator[str]:
    """Pretraining documents as strings; empty documents are dropped (they carry no tokens)."""
    if src.kind == DataSource.pydoc:
        from tinytrain.data.corpus import pydoc_documents

        yield from (d for d in pydoc_documents() if d.strip())
    elif src.kind == DataSource.hf:
        yield from _field_documents(_hf_records(src, [field or src.text_field]), field or src.text_field, bad)
    else:
        yield from shard_documents(files(src), src, bad, field)


def shard_documents(listed: list[Path], src: Source, bad: BadRecords, field: str | None = None) -> Iterator[str]:
    """The documents of these shards, in order, each read by its own format."""
    field = field or src.text_field
    for f in listed:
        fmt = shards.shard_format(f, src.kind)
        if fmt.kind == DataSource.text:
            yield from _text_documents(f, fmt, src.text_split, bad)
        else:
            yield from _field_documents(_shard_records(f, fmt, bad, [field]), field, bad)


def _field_documents(rows: Iterator[tuple[dict, str]], field: str, bad: BadRecords) -> Iterator[str]:
    for record, where in rows:
        text = record.get(field)
        if field not in record:
            bad.report(where, f"missing field '{field}'", f"fields: {', '.join(record) or 'none'}", "add the field or set data.text_field")
        elif not isinstance(text, str):
            bad.report(where, f"field '{field}' is not a string", f"{type(text).__name__}")
        elif text.strip():
            yield text


def _text_documents(f: Path, fmt: shards.Format, split: TextSplit, bad: BadRecords) -> Iterator[str]:
    """Blank-line blocks (or the whole file, data.text_split=file) read 1 MiB at a time: memory is one
    read plus the block in progress. A block that is not UTF-8 is a bad record named by its line."""
    blocks = _file_blocks if split == TextSplit.file else _blank_line_blocks
    seen_any = False
    with shards.open_binary(f, fmt) as stream:
        try:
            for start_byte, start_line, block in blocks(stream):
                stripped = block.strip()
                if not stripped:
                    continue
                seen_any = True
                try:
                    yield stripped.decode("utf-8")
                except UnicodeDecodeError as e:
                    at = start_byte + (len(block) - len(block.lstrip())) + e.start
                    line = start_line + block[: (len(block) - len(block.lstrip())) + e.start].count(b"\n")
                    bad.report(f"{f}:{line}", "not UTF-8", f"byte {at}: {stripped[e.start : e.start + 1]!r}", "convert the file to UTF-8")
        except ShardDamaged as e:
            bad.report(str(f), "damaged compressed shard", str(e), DAMAGED_FIX)
            return
    if not seen_any:
        bad.report(str(f), "empty file", fix="remove it")


def _file_blocks(stream) -> Iterator[tuple[int, int, bytes]]:
    yield 0, 1, stream.read()


def _read_chunk(stream) -> tuple[bytes, ShardDamaged | None]:
    """Up to READ_BYTES, one decompressed piece at a time, and the damage met, if any: a single
    read() that met damage midway dropped everything it had gathered (a truncated shard of under
    1 MiB kept no document under data.bad_records=skip)."""
    parts, size = [], 0
    try:
        while size < shards.READ_BYTES:
            piece = stream.read1(shards.READ_BYTES - size)
            if not piece:
                break
            parts.append(piece)
            size += len(piece)
    except ShardDamaged as e:
        return b"".join(parts), e
    return b"".join(parts), None


def _blank_line_blocks(stream) -> Iterator[tuple[int, int, bytes]]:
    """(byte offset, line number, bytes) of each block between blank lines. At damage, the blocks
    before it, then ShardDamaged (the block it cut is not a document)."""
    carry = b""
    byte, line = 0, 1  # where `carry` starts
    while True:
        chunk, damage = _read_chunk(stream)
        if damage is not None and not chunk:
            raise damage
        buf = carry + chunk
        # Only separators followed by more data are final: at the end of a read a separator may
        # continue (more blank lines, or "\r").
        cut = 0
        for m in BLANK_LINE.finditer(buf):
            if chunk and m.end() == len(buf):
                break
            block = buf[cut : m.start()]
            yield byte + cut, line, block
            line += buf.count(b"\n", cut, m.end())
            cut = m.end()
        byte += cut
        carry = buf[cut:]
        if damage is not None:
            raise damage
        if not chunk:
            if carry:
                yield byte, line, carry
            return


def records(src: Source, bad: BadRecords, columns: list[str] | None = None) -> Iterator[tuple[dict, str]]:
    """Records of a jsonl / parquet / hf source with their locations."""
    if src.kind == DataSource.hf:
        yield from _hf_records(src, columns)
        return
    if src.kind not in (DataSource.jsonl, DataSource.parquet):
        raise ConfigError(Problem("data.source", src.kind.value, "holds documents, not records", "use data.source=jsonl, parquet or hf for SFT records"))
    for f in files(src):
        fmt = shards.shard_format(f, src.kind)
        if fmt.kind == DataSource.text:
            raise ConfigError(Problem(src.key, src.path, f"{f} is text: it holds documents, not records", "keep SFT records (.jsonl, .jsonl.gz/.zst, .parquet) in their own folder"))
        yield from _shard_records(f, fmt, bad, columns)


def _shard_records(f: Path, fmt: shards.Format, bad: BadRecords, columns: list[str] | None) -> Iterator[tuple[dict, str]]:
    if fmt.kind == DataSource.parquet:
        yield from _parquet_records(f, bad, columns)
    else:
        yield from _jsonl_records(f, fmt, bad)


def _jsonl_records(f: Path, fmt: shards.Format, bad: BadRecords) -> Iterator[tuple[dict, str]]:
    seen_any = False
    number = 0
    with shards.open_binary(f, fmt) as lines:
        while True:
            try:
                raw = lines.readline()
            except ShardDamaged as e:
                bad.report(f"{f}:{number + 1}", "damaged compressed shard", str(e), DAMAGED_FIX)
                return
            if not raw:
                break
            number += 1
            if not raw.strip():
                continue
            seen_any = True
            where = f"{f}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                bad.report(where, "not UTF-8", f"byte {e.start} of the line: {raw[e.start : e.start + 1]!r}", "convert the file to UTF-8")
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as e:
                bad.report(where, "not JSON", f"{e.msg} at column {e.colno}")
                continue
            if not isinstance(record, dict):
                bad.report(where, "not a JSON object", type(record).__name__)
                continue
            yield record, where
    if not seen_any:
        bad.report(str(f), "empty file", fix="remove it")


def _parquet_records(f: Path, bad: BadRecords, columns: list[str] | None) -> Iterator[tuple[dict, str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(f)
    except (pa.ArrowException, OSError) as e:
        bad.report(str(f), "not a Parquet file", str(e).splitlines()[0])
        return
    names = pf.schema_arrow.names
    missing = [c for c in columns or [] if c not in names]
    if missing:
        raise ConfigError(Problem("data.text_field", missing[0], f"not a column of {f} (columns: {', '.join(names)})", "set data.text_field to one of those columns"))
    if pf.metadata.num_rows == 0:
        bad.report(str(f), "empty file", fix="remove it")
        return
    row = 0
    batches = pf.iter_batches(batch_size=BATCH_ROWS, columns=columns)  # one row group's batch at a time
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as e:
            bad.report(f"{f} row {row}", "damaged Parquet row group", str(e).splitlines()[0], DAMAGED_FIX)
            return
        if batch is None:
            return
        for record in batch.to_pylist():
            yield record, f"{f} row {row}"
            row += 1


def load_hf(src: Source):
    """A saved dataset folder (save_to_disk), a local dataset folder (data files), or a hub name."""
    import datasets

    p = Path(src.path)
    try:
        if p.is_dir() and any((p / m).exists() for m in HF_SAVED_MARKERS):
            ds = datasets.load_from_disk(str(p))
        else:
            ds = datasets.load_dataset(src.path, split=src.hf_split)
    except Exception as e:  # noqa: BLE001 - datasets raises many types (not found, offline, bad files); all mean "cannot load"
        where = "hub name (is the hub reachable? offline, use a local folder)" if not p.exists() else "folder"
        raise ConfigError(Problem(src.key, src.path, f"could not load this dataset {where}: {str(e).splitlines()[0]}", "point it at a save_to_disk folder or a folder of data files")) from e
    if isinstance(ds, datasets.DatasetDict):
        if src.hf_split not in ds:
            raise ConfigError(Problem("data.hf_split", src.hf_split, f"not a split of {src.path} (splits: {', '.join(ds)})", "set data.hf_split to one of those"))
        ds = ds[src.hf_split]
    if len(ds) == 0:
        raise ConfigError(Problem(src.key, src.path, "the dataset has no rows", "point it at a dataset with data"))
    return ds


def _hf_records(src: Source, columns: list[str] | None) -> Iterator[tuple[dict, str]]:
    ds = load_hf(src)
    missing = [c for c in columns or [] if c not in ds.column_names]
    if missing:
        raise ConfigError(Problem("data.text_field", missing[0], f"not a column of {src.path} (columns: {', '.join(ds.column_names)})", "set data.text_field to one of those columns"))
    if columns:
        ds = ds.select_columns(columns)
    row = 0
    for batch in ds.iter(batch_size=BATCH_ROWS):
        keys = list(batch)
        for values in zip(*(batch[k] for k in keys)):
            yield dict(zip(keys, values)), f"{src.path} row {row}"
            row += 1


def _empty_file_problem(files: list[Path], key: str, path: str, is_file: bool) -> list[Problem]:
    if all(f.stat().st_size == 0 for f in files):
        return [Problem(key, path, "is empty" if is_file else "holds only empty files", f"point {key} at data with documents in it")]
    return []


def source_path_problems(source: DataSource, path: str | None, key: str) -> list[Problem]:
    if source == DataSource.pydoc:
        if key == "data.val_path":
            return [Problem(key, path, "data.source=pydoc is one embedded corpus; it is split by data.val_fraction", "remove data.val_path")]
        return []
    if not path:
        return [Problem(key, path, f"data.source={source.value} needs a path", f"set {key} to a file or folder")]
    p = Path(path)
    if source == DataSource.hf:
        looks_local = path.startswith((".", "/", "~")) or p.suffix != ""
        if looks_local and not p.exists():
            return [Problem(key, path, "no such folder", "point it at a save_to_disk folder, a folder of data files, or a hub name")]
        return []
    try:
        listed = shards.list_shards(path, key, source)
    except ConfigError as e:
        return e.problems
    unreadable = [f for f in listed if not os.access(f, os.R_OK)]
    if unreadable:
        return [Problem(key, path, f"not readable: {unreadable[0]}", f"point {key} at readable shards ({shards.READABLE})")]
    return _empty_file_problem(listed, key, path, p.is_file())

"""Where documents and records come from: text files, JSON Lines, Parquet, Hugging Face datasets,
and the embedded pydoc corpus.

Readers stream: `documents()` yields pretraining texts, `records()` yields SFT records (dicts), each
with its location ("data.jsonl:12", "part-0.parquet row 7") so a bad one can be named. Unusable
records go through BadRecords (data.bad_records). A source's fingerprint is what the token store is
keyed by: its kind, its files with size and modification time, and the options that change what
is read.
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
from tinytrain.data.bad_records import BadRecords
from tinytrain.errors import ConfigError, Problem

# The one file-suffix table: a folder source reads its files by it, validation checks them by it,
# and a mixture entry without `source` takes its kind from it (data/mixture.py).
SUFFIX = {DataSource.text: ".txt", DataSource.jsonl: ".jsonl", DataSource.parquet: ".parquet"}
KIND_BY_SUFFIX = {suffix: kind for kind, suffix in SUFFIX.items()}
RECORD_SOURCES = (DataSource.jsonl, DataSource.parquet, DataSource.hf)  # where SFT records come from
# Also splits "\r\n\r\n" (the stray "\r" is stripped with the block); a leading "\r?" would make
# the regex engine ~5x slower on large files.
BLANK_LINE = re.compile(r"\n[ \t]*\r?\n")
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
    """The files of a text/jsonl/parquet source: the file itself, or a folder's files (recursive, sorted)."""
    p = Path(src.path)
    if p.is_dir():
        return sorted(f for f in p.rglob(f"*{SUFFIX[src.kind]}") if f.is_file())
    return [p]


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
        root = Path(src.path).resolve()
        listed = files(src)
        payload["files"] = [(str(f.resolve().relative_to(root)) if root.is_dir() else str(root), f.stat().st_size, f.stat().st_mtime_ns) for f in listed]
    if src.kind == DataSource.text:
        payload["text_split"] = src.text_split.value
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def documents(src: Source, bad: BadRecords, field: str | None = None) -> Iterator[str]:
    """Pretraining documents as strings; empty documents are dropped (they carry no tokens)."""
    if src.kind == DataSource.pydoc:
        from tinytrain.data.corpus import pydoc_documents

        yield from (d for d in pydoc_documents() if d.strip())
    elif src.kind == DataSource.text:
        yield from _text_documents(src, bad)
    else:
        field = field or src.text_field
        for record, where in records(src, bad, columns=[field]):
            text = record.get(field)
            if field not in record:
                bad.report(where, f"missing field '{field}'", f"fields: {', '.join(record) or 'none'}", "add the field or set data.text_field")
            elif not isinstance(text, str):
                bad.report(where, f"field '{field}' is not a string", f"{type(text).__name__}")
            elif text.strip():
                yield text


def _text_documents(src: Source, bad: BadRecords) -> Iterator[str]:
    for f in files(src):
        raw = f.read_bytes()
        if not raw.strip():
            bad.report(str(f), "empty file", fix="remove it")
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            line = raw[: e.start].count(b"\n") + 1
            bad.report(f"{f}:{line}", "not UTF-8", f"byte {e.start}: {raw[e.start : e.start + 1]!r}", "convert the file to UTF-8")
            continue
        if src.text_split == TextSplit.file:
            yield text.strip()
        else:
            yield from (block.strip() for block in BLANK_LINE.split(text) if block.strip())


def records(src: Source, bad: BadRecords, columns: list[str] | None = None) -> Iterator[tuple[dict, str]]:
    """Records of a jsonl / parquet / hf source with their locations."""
    if src.kind == DataSource.jsonl:
        for f in files(src):
            yield from _jsonl_records(f, bad)
    elif src.kind == DataSource.parquet:
        for f in files(src):
            yield from _parquet_records(f, bad, columns)
    elif src.kind == DataSource.hf:
        yield from _hf_records(src, columns)
    else:
        raise ConfigError(Problem("data.source", src.kind.value, "holds documents, not records", "use data.source=jsonl, parquet or hf for SFT records"))


def _jsonl_records(f: Path, bad: BadRecords) -> Iterator[tuple[dict, str]]:
    seen_any = False
    with f.open("rb") as lines:
        for number, raw in enumerate(lines, start=1):
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
    for batch in pf.iter_batches(batch_size=BATCH_ROWS, columns=columns):
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
    suffix = SUFFIX[source]
    fix = f"point {key} at a readable file or a folder of {suffix} files"
    if not p.exists():
        return [Problem(key, path, "no such file or folder", fix)]
    listed = [p] if p.is_file() else sorted(p.rglob(f"*{suffix}"))
    if not listed:
        return [Problem(key, path, f"folder holds no {suffix} files", fix)]
    unreadable = [f for f in listed if not os.access(f, os.R_OK)]
    if unreadable:
        return [Problem(key, path, f"not readable: {unreadable[0]}", fix)]
    return _empty_file_problem(listed, key, path, p.is_file())

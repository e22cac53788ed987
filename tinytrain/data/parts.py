"""A token store in parts: a large source's shards, sorted by path, split into data.prepare_parts
contiguous runs; each run tokenized on its own into a part, opened together as one store.

    <cache_dir>/parts/<part key>/     a complete single store (store.py) of one run of files; the key
                                      covers those files (path, size, mtime), the reading options,
                                      the tokenizer and BOS/EOS: a changed or added file changes only
                                      its part's key, so only that part is built again (later
                                      builds keep an earlier build's part ranges: anchored_split)
    <cache_dir>/stores/<store key>/   parts.json  which parts make the store (written first)
                                      doc_offsets.npy, part_token_starts.npy, then manifest.json last:
                                      the store is complete when the manifest exists

Each part is built under its own build lock (build_lock.py, no flock needed), atomically, by whichever
process gets there first: `mode=prepare` builds every missing part in parallel processes, or one part
(`data.prepare_part=i`, a Slurm array task); whoever completes the last part writes the manifest.
Document order is the files' order, so the parts opened together hold exactly the documents and
tokens of a one-process build over the same files.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tinytrain.data import sources, store
from tinytrain.data.bad_records import BadRecords
from tinytrain.data.build_lock import BuildLock
from tinytrain.data.store import META, OFFSETS, TokenStore
from tinytrain.errors import ConfigError, Problem

log = logging.getLogger(__name__)

PLAN, MANIFEST, PART_STARTS = "parts.json", "manifest.json", "part_token_starts.npy"


@dataclass(frozen=True)
class Part:
    index: int
    files: tuple[tuple[str, int, int], ...]  # (path, size, mtime) in read order
    key: str

    def describe(self, count: int) -> str:
        first, last = Path(self.files[0][0]).name, Path(self.files[-1][0]).name
        span = first if len(self.files) == 1 else f"{first} .. {last}"
        return f"part {self.index} of {count} ({len(self.files)} files: {span})"


@dataclass(frozen=True)
class Layout:
    """Which parts a source makes for this tokenizer and policy, and where they live."""

    store_key: str
    store_dir: Path
    parts_dir: Path
    parts: tuple[Part, ...]
    meta: dict  # what every part's meta.json and the manifest say about source and tokenizer
    command: str  # the mode=prepare command that builds this store (less data.prepare_part), for messages

    def part_dir(self, part: Part) -> Path:
        return self.parts_dir / part.key


def split(listed: list[Path], count: int, key: str) -> list[list[Path]]:
    """Contiguous runs of the sorted files, as even in count as they divide."""
    n = len(listed)
    if count > n:
        raise ConfigError(Problem("data.prepare_parts", count, f"{key} has {n} shard file(s); a part is at least one file", f"use data.prepare_parts<={n}"))
    return [listed[i * n // count : (i + 1) * n // count] for i in range(count)]


def previous_ranges(stores_dir: Path, lineage: str) -> list[tuple[Path, Path]]:
    """(first, last) file of each part of the newest store built before from this source with the
    same options, tokenizer and part count (its parts.json); [] when there is none."""
    plans = []
    for path in stores_dir.glob(f"*/{PLAN}"):
        try:
            plan = json.loads(path.read_text())
            if plan.get("lineage") == lineage:
                plans.append((path.stat().st_mtime_ns, plan))
        except (OSError, ValueError):
            continue  # being written, or removed: another store's
    if not plans:
        return []
    newest = max(plans, key=lambda p: p[0])[1]
    return [(Path(part["files"][0][0]), Path(part["files"][-1][0])) for part in newest["parts"]]


def anchored_split(listed: list[Path], ranges: list[tuple[Path, Path]]) -> list[list[Path]] | None:
    """The files assigned to the parts of an earlier build, so that an added or changed file only
    rebuilds the part it lands in: a file up to a part's last file belongs to the first such part,
    a file after the last part's last file to the last part. Files stay in sorted order (so the
    parts still equal a one-process build). None (split afresh) without earlier parts, or when a
    part would be left with no file."""
    if not ranges:
        return None
    runs: list[list[Path]] = [[] for _ in ranges]
    for f in listed:
        resolved = f.resolve()
        index = next((i for i, (_, last) in enumerate(ranges) if resolved <= last), len(ranges) - 1)
        runs[index].append(f)
    return runs if all(runs) else None


def _key(*payload) -> str:
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def layout(src, data_cfg, tokenizer) -> Layout:
    from tinytrain.data.tokenizer import fingerprint

    tokenizer_fp = fingerprint(tokenizer)
    options = {"kind": src.kind.value, "bad_records": src.bad_records.value, "text_split": src.text_split.value, "text_field": src.text_field}
    policy = (tokenizer_fp, data_cfg.append_eos, data_cfg.prepend_bos)
    root = Path(data_cfg.cache_dir)
    lineage = _key(src.key, options, policy, data_cfg.prepare_parts)
    listed = sources.files(src)
    runs = anchored_split(listed, previous_ranges(root / "stores", lineage)) or split(listed, data_cfg.prepare_parts, src.key)
    parts = []
    for i, run in enumerate(runs):
        stats = tuple(tuple(s) for s in sources.file_stats(run))
        parts.append(Part(i, stats, store.store_key(_key(options, stats), *policy)))
    store_key = store.store_key(_key(options, [p.key for p in parts]), *policy)
    meta = {
        "lineage": lineage,
        "source_key": src.key,
        "source": src.describe(),
        "tokenizer": str(tokenizer.name_or_path),
        "tokenizer_fingerprint": tokenizer_fp,
        "append_eos": data_cfg.append_eos,
        "prepend_bos": data_cfg.prepend_bos,
    }
    return Layout(store_key, root / "stores" / store_key, root / "parts", tuple(parts), meta, prepare_command(src, data_cfg, str(tokenizer.name_or_path)))


def prepare_command(src, data_cfg, tokenizer_path: str) -> str:
    """The command line that builds this store again: every option its key depends on, with
    absolute paths (a message may be read in another folder). The tokenizer by its path; added
    special tokens are the caller's to repeat (tokenizer.add_special_tokens)."""
    import shlex

    options = {
        "data.source": src.kind.value,
        "data.path": str(Path(src.path).absolute()) if src.path and Path(src.path).exists() else src.path,  # a hub dataset stays a name
        "data.text_split": src.text_split.value,
        "data.text_field": src.text_field,
        "data.bad_records": src.bad_records.value,
        "data.append_eos": str(data_cfg.append_eos).lower(),
        "data.prepend_bos": str(data_cfg.prepend_bos).lower(),
        "data.cache_dir": str(Path(data_cfg.cache_dir).absolute()),
        "tokenizer.path": tokenizer_path,
        "data.prepare_parts": data_cfg.prepare_parts,
    }
    return " ".join(["python -m tinytrain mode=prepare", *(shlex.quote(f"{k}={v}") for k, v in options.items())])


def rebuild_fix(store_dir: Path, missing: list[tuple[int, int]]) -> str:
    """How to build a store's missing parts: the command its parts.json recorded, else the recipe."""
    i, n = missing[0]
    try:
        command = json.loads((store_dir / PLAN).read_text()).get("prepare_command")
    except (OSError, ValueError, AttributeError):
        command = None
    if command:
        return f"build {'it' if len(missing) == 1 else 'them'} again: {command} data.prepare_part={i} (without data.prepare_part: every missing part; add the tokenizer.add_special_tokens it was built with, if any)"
    return f"build them: python -m tinytrain mode=prepare <the same data options> data.prepare_parts={n} data.prepare_part={i} (or without data.prepare_part: every missing part)"


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    with tmp.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_plan(lay: Layout) -> None:
    """parts.json: which parts make the store (the same bytes from every writer)."""
    try:
        lay.store_dir.mkdir(parents=True, exist_ok=True)
        lay.parts_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(Problem("data.cache_dir", str(lay.store_dir.parent.parent), f"cannot create {e.filename}: {e.strerror}", "set data.cache_dir to a writable folder")) from e
    plan = {**lay.meta, "store_key": lay.store_key, "prepare_command": lay.command, "parts": [{"index": p.index, "key": p.key, "files": [list(f) for f in p.files]} for p in lay.parts]}
    data = json.dumps(plan, indent=1).encode()
    path = lay.store_dir / PLAN
    if not path.exists() or path.read_bytes() != data:
        _write_atomic(path, data)


class _FastTokenizer:
    """What a part's build needs of a fast tokenizer, picklable into a spawned process."""

    def __init__(self, tokenizer):
        self.json = tokenizer.backend_tokenizer.to_str()
        self.size = len(tokenizer)
        self.eos_token_id, self.bos_token_id = tokenizer.eos_token_id, tokenizer.bos_token_id
        self.name_or_path = str(tokenizer.name_or_path)

    def __len__(self) -> int:
        return self.size

    @property
    def backend_tokenizer(self):
        return self

    def to_str(self) -> str:
        return self.json


def build_part(lay: Layout, index: int, src, bad_policy, tokenizer, workers: int, progress: bool = False) -> tuple[TokenStore, bool]:
    """Part `index`, reused when complete, else built under its lock. Returns (part, built_now)."""
    part = lay.parts[index]
    final = lay.part_dir(part)
    what = part.describe(len(lay.parts))
    if (final / META).exists():
        return TokenStore.open(final, key="data.cache_dir"), False
    lay.parts_dir.mkdir(parents=True, exist_ok=True)
    with BuildLock(lay.parts_dir / f"{part.key}.lock", what):
        if (final / META).exists():  # built by another process while this one waited
            return TokenStore.open(final, key="data.cache_dir"), False
        for stale in lay.parts_dir.glob(f".{part.key}.tmp-*"):  # left by a killed build; never used
            shutil.rmtree(stale, ignore_errors=True)
        bad = BadRecords(bad_policy, src.key)
        meta = {**lay.meta, "store_key": part.key, "part": part.index, "parts": len(lay.parts), "files": [list(f) for f in part.files]}
        docs = sources.shard_documents([Path(f[0]) for f in part.files], src, bad)
        built = store.build(final, docs, tokenizer, meta, workers, progress, bad)
        if bad.total:
            log.warning("%s: %s", what, bad.summary())
        return built, True


def _build_part_process(lay: Layout, index: int, src, bad_policy, tokenizer) -> tuple[int, bool, float]:
    """One part in a spawned process (mode=prepare's parallel build): tokenizes in that process."""
    started = time.perf_counter()
    _, built = build_part(lay, index, src, bad_policy, tokenizer, workers=0)
    return index, built, time.perf_counter() - started


def build_missing(lay: Layout, src, data_cfg, tokenizer, progress: bool) -> list[str]:
    """Every part not yet built, in parallel processes (one per part, at most data.tokenize_workers
    or one per core); lines saying what was built and reused."""
    missing = [p.index for p in lay.parts if not (lay.part_dir(p) / META).exists()]
    lines = [f"{p.describe(len(lay.parts))}: reused" for p in lay.parts if p.index not in missing]
    workers = store.default_workers() if data_cfg.tokenize_workers is None else data_cfg.tokenize_workers
    fast = getattr(tokenizer, "backend_tokenizer", None) is not None
    if len(missing) <= 1 or workers <= 1 or not fast:
        for i in missing:
            started = time.perf_counter()
            _, built = build_part(lay, i, src, data_cfg.bad_records, tokenizer, workers, progress)
            lines.append(f"{lay.parts[i].describe(len(lay.parts))}: {'built' if built else 'built by another process'} in {time.perf_counter() - started:.1f} s")
        return sorted(lines, key=_part_number)
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    spec = _FastTokenizer(tokenizer)
    with ProcessPoolExecutor(min(workers, len(missing)), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_build_part_process, lay, i, src, data_cfg.bad_records, spec) for i in missing]
        for future in futures:
            i, built, seconds = future.result()
            line = f"{lay.parts[i].describe(len(lay.parts))}: {'built' if built else 'built by another process'} in {seconds:.1f} s"
            log.info(line)
            lines.append(line)
    return sorted(lines, key=_part_number)


def _part_number(line: str) -> int:
    return int(line.split()[1])


def finish(lay: Layout) -> bool:
    """Writes the manifest when every part is complete (idempotent; the last part's builder does it).
    Returns whether the store is complete."""
    if (lay.store_dir / MANIFEST).exists():
        return True
    if any(not (lay.part_dir(p) / META).exists() for p in lay.parts):
        return False
    with BuildLock(lay.store_dir / f"{MANIFEST}.lock", f"token store {lay.store_key}"):
        if (lay.store_dir / MANIFEST).exists():
            return True
        metas = [json.loads((lay.part_dir(p) / META).read_text()) for p in lay.parts]
        counts = [m["num_documents"] for m in metas]
        tokens = [m["num_tokens"] for m in metas]
        starts = np.concatenate([[0], np.cumsum(tokens)]).astype(np.int64)
        # The one store's document index, written part by part (never all parts' offsets at once).
        tmp = lay.store_dir / f".{OFFSETS}.tmp-{os.getpid()}"
        offsets = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int64, shape=(sum(counts) + 1,))
        at = 0
        for p, n, start in zip(lay.parts, counts, starts):
            offsets[at : at + n] = np.load(lay.part_dir(p) / OFFSETS, mmap_mode="r")[:-1] + start
            at += n
        offsets[at] = starts[-1]
        offsets.flush()
        del offsets
        os.replace(tmp, lay.store_dir / OFFSETS)
        with (lay.store_dir / f".{PART_STARTS}.tmp").open("wb") as f:
            np.save(f, starts)
        os.replace(lay.store_dir / f".{PART_STARTS}.tmp", lay.store_dir / PART_STARTS)
        bad = {}
        for m in metas:
            for kind, n in m.get("bad_record_counts", {}).items():
                bad[kind] = bad.get(kind, 0) + n
        manifest = {
            **lay.meta,
            "format": store.STORE_FORMAT,
            "store_key": lay.store_key,
            "dtype": metas[0]["dtype"],
            "true_vocab": metas[0]["true_vocab"],
            "num_documents": int(sum(counts)),
            "num_tokens": int(starts[-1]),
            "max_token_id": max(m["max_token_id"] for m in metas),
            "tokenize_workers": metas[0]["tokenize_workers"],
            "build_seconds": round(sum(m["build_seconds"] for m in metas), 3),
            "bad_records": f"skipped {sum(bad.values())} bad records: " + ", ".join(f"{n} {k}" for k, n in sorted(bad.items())) if bad else "no bad records",
            "parts": [{"index": p.index, "key": p.key, "num_documents": n, "num_tokens": t} for p, n, t in zip(lay.parts, counts, tokens)],
        }
        _write_atomic(lay.store_dir / MANIFEST, json.dumps(manifest, indent=1).encode())  # last: the store is complete
    return True


def ensure(src, data_cfg, tokenizer, progress: bool = True) -> tuple[PartedStore, bool]:
    """The parted store for this source: missing parts built, the manifest written, opened."""
    lay = layout(src, data_cfg, tokenizer)
    gone = [p.describe(len(lay.parts)) for p in lay.parts if not (lay.part_dir(p) / META).exists()]
    if (lay.store_dir / MANIFEST).exists() and not gone:
        return PartedStore.open(lay.store_dir, key="data.cache_dir"), False
    if (lay.store_dir / MANIFEST).exists():
        # Deleted after the build (a cache cleaned by hand): the same files make the same part, so
        # the manifest stays true once it is built again.
        log.warning("token store %s: %s deleted since the store was built; building it again", lay.store_dir, ", ".join(gone))
    write_plan(lay)
    lines = build_missing(lay, src, data_cfg, tokenizer, progress)
    finish(lay)
    opened = PartedStore.open(lay.store_dir, key="data.cache_dir")
    opened.build_lines = lines
    return opened, True


def prepare_one(src, data_cfg, tokenizer) -> list[str]:
    """mode=prepare data.prepare_part=i: part i (if not built), then the manifest if it was the last."""
    lay = layout(src, data_cfg, tokenizer)
    write_plan(lay)
    i = data_cfg.prepare_part
    started = time.perf_counter()
    workers = store.default_workers() if data_cfg.tokenize_workers is None else data_cfg.tokenize_workers
    existed = (lay.part_dir(lay.parts[i]) / META).exists()
    part, built = build_part(lay, i, src, data_cfg.bad_records, tokenizer, workers, progress=True)
    how = "built" if built else "already built" if existed else "built by another process (waited for it)"
    lines = [f"{lay.parts[i].describe(len(lay.parts))}: {how} in {time.perf_counter() - started:.1f} s at {part.path}: {part.describe()}"]
    if finish(lay):
        lines.append(f"token store {lay.store_dir} complete: all {len(lay.parts)} parts built (manifest written)")
    else:
        waiting = [p.index for p in lay.parts if not (lay.part_dir(p) / META).exists()]
        lines.append(f"token store {lay.store_dir}: parts {', '.join(map(str, waiting))} still to build")
    return lines


def missing_parts(store_dir: Path) -> list[tuple[int, int]]:
    """(index, count) of the parts a parts.json names that are not built; [] when none or no plan."""
    try:
        plan = json.loads((store_dir / PLAN).read_text())
    except (OSError, ValueError):
        return []
    parts_dir = store_dir.parent.parent / "parts"
    return [(p["index"], len(plan["parts"])) for p in plan["parts"] if not (parts_dir / p["key"] / META).exists()]


class _PartedTokens:
    """The parts' token files read as one array: `tokens[positions]` for sorted positions."""

    def __init__(self, parts: list[TokenStore], starts: np.ndarray):
        self.parts, self.starts = parts, starts
        self.dtype = np.dtype(parts[0].meta["dtype"])
        self.size = int(starts[-1])

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index):
        if isinstance(index, slice):
            index = np.arange(*index.indices(self.size))
        index = np.asarray(index, dtype=np.int64)
        which = np.searchsorted(self.starts, index, side="right") - 1
        if index.size and which[0] == which[-1]:  # a window inside one part: the common case
            return self.parts[which[0]].tokens[index - self.starts[which[0]]]
        out = np.empty(index.shape, dtype=self.dtype)
        for p in np.unique(which):
            sel = which == p
            out[sel] = self.parts[p].tokens[index[sel] - self.starts[p]]
        return out


class PartedStore(TokenStore):
    """A complete parted store opened as one: `offsets` and `tokens` span every part, in order."""

    build_lines: list[str] = []

    def __init__(self, path: Path, meta: dict, offsets: np.ndarray, parts: list[TokenStore], starts: np.ndarray):
        super().__init__(path, meta, offsets)
        self.parts = parts
        self.starts = starts

    @classmethod
    def open(cls, path: Path | str, key: str = "data.store") -> PartedStore:
        path = Path(path)
        missing = missing_parts(path)
        if missing:
            i, n = missing[0]
            listed = ", ".join(str(m[0]) for m in missing)
            raise ConfigError(Problem(key, str(path), f"incomplete: part(s) {listed} of {n} not built", rebuild_fix(path, missing)))
        try:
            meta = json.loads((path / MANIFEST).read_text())
        except (OSError, ValueError) as e:
            raise ConfigError(Problem(key, str(path), f"not a complete token store ({MANIFEST}: {e})", "build it with mode=prepare")) from e
        parts_dir = path.parent.parent / "parts"
        parts = []
        for p in meta["parts"]:
            part = TokenStore.open(parts_dir / p["key"], key=key)
            what = f"part {p['index']} of {len(meta['parts'])} ({part.path})"
            if part.meta["tokenizer_fingerprint"] != meta["tokenizer_fingerprint"] or part.meta["num_documents"] != p["num_documents"]:
                raise ConfigError(Problem(key, str(path), f"{what} was built with tokenizer {part.meta['tokenizer_fingerprint']}, the store with {meta['tokenizer_fingerprint']}", f"delete {part.path} and build it again: mode=prepare data.prepare_part={p['index']}"))
            for name, size, mtime in part.meta.get("files", []):
                st = Path(name).stat() if Path(name).exists() else None
                if st is not None and (st.st_size, st.st_mtime_ns) != (size, mtime):
                    raise ConfigError(Problem(key, str(path), f"{what}: {name} changed since the part was built", "build the store again (mode=prepare with the same data options and without data.store: only the changed part is tokenized)"))
            parts.append(part)
        starts = np.load(path / PART_STARTS)
        offsets = np.load(path / OFFSETS, mmap_mode="r")
        if offsets.shape != (meta["num_documents"] + 1,) or offsets[-1] != meta["num_tokens"]:
            raise ConfigError(Problem(key, str(path), f"damaged: {OFFSETS} does not index {meta['num_documents']} documents", f"delete {path} and build it again (mode=prepare)"))
        return cls(path, meta, offsets, parts, starts)

    @property
    def tokens(self) -> _PartedTokens:
        if self._tokens is None:
            self._tokens = _PartedTokens(self.parts, self.starts)
        return self._tokens

    def read(self, start: int, stop: int) -> np.ndarray:
        first, last = (int(np.searchsorted(self.starts, x, side="right")) - 1 for x in (start, max(start, stop - 1)))
        pieces = [self.parts[p].read(max(start, int(self.starts[p])) - int(self.starts[p]), min(stop, int(self.starts[p + 1])) - int(self.starts[p])) for p in range(first, last + 1)]
        return pieces[0] if len(pieces) == 1 else np.concatenate(pieces)

    def describe(self) -> str:
        return f"{super().describe()}, {len(self.parts)} parts"

"""The pretraining token store: documents tokenized once into a memory-mapped token file.

A store is a folder holding `tokens.bin` (every document's ids, BOS/EOS per policy, uint16 when the
vocab fits, else uint32), `doc_offsets.npy` (int64, document d is tokens[offsets[d]:offsets[d+1]])
and `meta.json` (what it was built from). Stores in the cache are keyed by (source fingerprint,
tokenizer fingerprint, BOS/EOS policy), so another tokenizer gets its own store; a store named
explicitly (data.store) that was built with another tokenizer is refused.

Building is atomic: everything is written into a temporary sibling folder that is renamed into
place only when complete, so a crash mid-build leaves nothing that a later run would use. One
process builds (build_lock.py: a marker file, no flock needed); every other process (other ranks,
other runs, other nodes) waits and reuses it. A large source is built in parts (parts.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np

from tinytrain.data import tokenize_worker
from tinytrain.data.build_lock import BuildLock
from tinytrain.data.orphan_guard import stop_signals_held
from tinytrain.errors import ConfigError, Problem

log = logging.getLogger(__name__)

STORE_FORMAT = 1
# In the store key: stores built before special-token text was encoded as text are not reused.
SPECIAL_TEXT = "special tokens in documents encoded as text"
TOKENS, OFFSETS, META = "tokens.bin", "doc_offsets.npy", "meta.json"
CHUNK_CHARS = 1 << 20  # text per worker task: large enough to amortise the hand-off, small enough to stream
CHUNK_DOCS = 8192
PROGRESS_LOG_SECONDS = 10.0
RANDOM_ACCESS_TOKENS = 1 << 26  # stores above this are mapped for random access (small ones: readahead is free)


def token_dtype(true_vocab: int) -> np.dtype:
    """uint16 holds ids 0..65535, so any vocab of at most 65536 tokens; larger vocabs need uint32."""
    return np.dtype(np.uint16) if true_vocab <= 1 << 16 else np.dtype(np.uint32)


def store_key(source_fingerprint: str, tokenizer_fingerprint: str, append_eos: bool, prepend_bos: bool) -> str:
    payload = json.dumps([STORE_FORMAT, source_fingerprint, tokenizer_fingerprint, append_eos, prepend_bos, SPECIAL_TEXT])
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


class TokenStore:
    """An opened, complete store. Windows read the token file with read() (pread); `tokens` maps it
    whole on first use, for scans (and again in each DataLoader worker, never pickled)."""

    def __init__(self, path: Path, meta: dict, offsets: np.ndarray):
        self.path = path
        self.meta = meta
        self.offsets = offsets
        self._tokens: np.memmap | None = None
        self._file: tuple[int, int] | None = None  # (pid, descriptor) of the token file, for read()

    @classmethod
    def open(cls, path: Path | str, key: str = "data.store") -> TokenStore:
        path = Path(path)
        fix = f"delete {path} and build it again (python -m tinytrain mode=prepare ...)"
        try:
            meta = json.loads((path / META).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(Problem(key, str(path), f"not a complete token store ({META}: {e})", "point it at a folder built by mode=prepare")) from e
        if not isinstance(meta, dict) or meta.get("format") != STORE_FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else f"unknown ({META} holds a JSON {type(meta).__name__})"
            raise ConfigError(Problem(key, str(path), f"store format {found}, this tinytrain reads {STORE_FORMAT}", fix))
        try:
            itemsize = np.dtype(meta["dtype"]).itemsize
            size = (path / TOKENS).stat().st_size if (path / TOKENS).exists() else -1
            if size != int(meta["num_tokens"]) * itemsize:
                raise ConfigError(Problem(key, str(path), f"damaged: {TOKENS} has {size} bytes, meta.json says {meta['num_tokens']} tokens x {itemsize}", fix))
            # Mapped, not loaded: every rank and DataLoader worker shares the page cache's one copy.
            offsets = np.load(path / OFFSETS, mmap_mode="r")  # allow_pickle=False: an object array is refused
            whole = offsets.dtype.kind in "iu" and offsets.shape == (int(meta["num_documents"]) + 1,) and offsets[0] == 0 and offsets[-1] == meta["num_tokens"]
        except (KeyError, TypeError, ValueError, OSError) as e:
            raise ConfigError(Problem(key, str(path), f"damaged: {META} or {OFFSETS} unreadable ({type(e).__name__}: {' '.join(str(e).split())[:200]})", fix)) from e
        if not whole:
            raise ConfigError(Problem(key, str(path), f"damaged: {OFFSETS} does not index {meta['num_documents']} documents", fix))
        return cls(path, meta, offsets)

    def max_token_id(self) -> int:
        """Largest id in the store: recorded at build, else one pass over the tokens."""
        if "max_token_id" not in self.meta:
            self.meta["max_token_id"] = int(self.tokens.max()) if self.num_tokens else -1
        return self.meta["max_token_id"]

    @property
    def tokens(self) -> np.memmap:
        if self._tokens is None:
            self._tokens = np.memmap(self.path / TOKENS, dtype=np.dtype(self.meta["dtype"]), mode="r", shape=(self.meta["num_tokens"],))
            if self.meta["num_tokens"] > RANDOM_ACCESS_TOKENS:  # windows read at random places: no readahead
                from tinytrain.data.sample_index import random_access

                random_access(self._tokens)
        return self._tokens

    def read(self, start: int, stop: int) -> np.ndarray:
        """tokens[start:stop], read with pread rather than through the mapping: the page cache is
        shared all the same, but nothing is mapped into this process, so a rank's memory stays flat
        however many windows it reads (a mapped read maps the whole large folio around each one)."""
        if self._file is None or self._file[0] != os.getpid():  # opened again in a DataLoader worker
            self._file = (os.getpid(), os.open(self.path / TOKENS, os.O_RDONLY))
        dtype = np.dtype(self.meta["dtype"])
        data = os.pread(self._file[1], (stop - start) * dtype.itemsize, start * dtype.itemsize)
        return np.frombuffer(data, dtype=dtype)

    @property
    def num_documents(self) -> int:
        return self.meta["num_documents"]

    @property
    def num_tokens(self) -> int:
        return self.meta["num_tokens"]

    # A DataLoader worker gets the path, not the arrays: it maps the same files again.
    def __getstate__(self) -> dict:
        return {**self.__dict__, "_tokens": None, "offsets": None, "_file": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.offsets = np.load(self.path / OFFSETS, mmap_mode="r")

    def describe(self) -> str:
        m = self.meta
        return f"{m['num_documents']:,} documents, {m['num_tokens']:,} tokens ({m['dtype']}), tokenizer {m['tokenizer_fingerprint']}"

    def check_matches(self, tokenizer_fingerprint: str, tokenizer_path: str, append_eos: bool, prepend_bos: bool, key: str = "data.store", earlier: dict[str, str] | None = None) -> str | None:
        """A store is only usable with the tokenizer and BOS/EOS policy it was built with. One an
        older tinytrain built for the same tokenizer (`earlier`: tokenizer.earlier_fingerprints)
        holds the same token ids: it trains as built, and the returned line says so."""
        m = self.meta
        older = m["tokenizer_fingerprint"] in (earlier or {})
        if m["tokenizer_fingerprint"] != tokenizer_fingerprint and not older:
            raise ConfigError(
                Problem(
                    key,
                    str(self.path),
                    f"built with tokenizer {m['tokenizer_fingerprint']} ({m['tokenizer']}), but this run's tokenizer is "
                    f"{tokenizer_fingerprint} ({tokenizer_path}); its token ids would mean other tokens",
                    f"train with the tokenizer it was built with (tokenizer.path={m['tokenizer']}), or build a store for this "
                    "tokenizer: python -m tinytrain mode=prepare <the same tokenizer and data options> (without data.store)",
                )
            )
        if (m["append_eos"], m["prepend_bos"]) != (append_eos, prepend_bos):
            raise ConfigError(
                Problem(
                    key,
                    str(self.path),
                    f"built with append_eos={m['append_eos']}, prepend_bos={m['prepend_bos']}; this run asks for append_eos={append_eos}, prepend_bos={prepend_bos}",
                    f"set data.append_eos={str(m['append_eos']).lower()} data.prepend_bos={str(m['prepend_bos']).lower()}, or build a store with mode=prepare",
                )
            )
        if older:
            return (
                f"built by an older tinytrain's encoding of this tokenizer (fingerprint {m['tokenizer_fingerprint']}, the same token ids): "
                "it trains as it was built; mode=prepare (without data.store) builds one in this tinytrain's encoding"
            )
        return None


class _Progress:
    """A progress bar on a terminal; a log line every few seconds otherwise (logs, CI)."""

    def __init__(self, enabled: bool, what: str):
        self.bar = None
        self.what = what
        self.enabled = enabled
        self.start = self.last_log = time.perf_counter()
        self.tokens = self.docs = 0
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(desc=f"tokenizing {what}", unit=" tokens", unit_scale=True, mininterval=0.5, file=sys.stderr)

    def update(self, tokens: int, docs: int) -> None:
        self.tokens += tokens
        self.docs += docs
        if self.bar is not None:
            self.bar.update(tokens)
        elif self.enabled and time.perf_counter() - self.last_log > PROGRESS_LOG_SECONDS:
            self.last_log = time.perf_counter()
            log.info("tokenizing %s: %s documents, %s tokens, %.0f tokens/s", self.what, f"{self.docs:,}", f"{self.tokens:,}", self.tokens / (self.last_log - self.start))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _chunks(docs: Iterable[str]) -> Iterator[list[str]]:
    chunk: list[str] = []
    chars = 0
    for doc in docs:
        chunk.append(doc)
        chars += len(doc)
        if chars >= CHUNK_CHARS or len(chunk) >= CHUNK_DOCS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


def default_workers() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def encoded_chunks(docs: Iterable[str], tokenizer, dtype: np.dtype, eos: int | None, bos: int | None, workers: int) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
    """(flat ids, lengths, largest id) per chunk of documents, in document order.

    workers >= 1: that many spawned processes, one core each, at most 2 chunks queued per worker so
    memory stays bounded on any corpus size. workers = 0: in this process."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:  # a Python (slow) tokenizer: no Rust batch encoder to hand to workers
        for chunk in _chunks(docs):
            yield tokenize_worker.flatten(tokenizer(chunk, add_special_tokens=False, split_special_tokens=True)["input_ids"], eos, bos, dtype)
        return
    init_args = (backend.to_str(), eos, bos, dtype.str)
    if workers == 0:
        tokenize_worker.init(*init_args, single_thread=False)
        for chunk in _chunks(docs):
            yield tokenize_worker.encode(chunk)
        return
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: the parent may already run torch / tokenizer threads, which fork would copy mid-flight.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=tokenize_worker.init, initargs=(*init_args, True, os.getpid())) as pool:
        pending: deque = deque()
        for chunk in _chunks(docs):
            with stop_signals_held():  # a submit may start a worker
                pending.append(pool.submit(tokenize_worker.encode, chunk))
            if len(pending) >= 2 * workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def build(final: Path, docs: Iterable[str], tokenizer, meta: dict, workers: int, progress: bool = True, bad=None) -> TokenStore:
    """Tokenize `docs` into a store at `final`, atomically. `meta` describes the source and policy;
    `bad` (BadRecords) is the reader's record of skipped records, summarised into meta.json."""
    true_vocab = len(tokenizer)
    dtype = token_dtype(true_vocab)
    eos = tokenizer.eos_token_id if meta["append_eos"] else None
    bos = tokenizer.bos_token_id if meta["prepend_bos"] else None
    if meta["prepend_bos"] and bos is None:
        raise ConfigError(Problem("data.prepend_bos", True, "the tokenizer has no BOS token", "set data.prepend_bos=false"))
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    started = time.perf_counter()
    bar = _Progress(progress, meta["source"])
    try:
        lengths: list[np.ndarray] = []
        max_token_id = -1
        with (tmp / TOKENS).open("wb") as out:
            for flat, chunk_lengths, largest in encoded_chunks(docs, tokenizer, dtype, eos, bos, workers):
                max_token_id = max(max_token_id, int(largest))
                if largest >= true_vocab:
                    raise ConfigError(Problem("tokenizer.path", str(tokenizer.name_or_path), f"produced token id {largest} >= len(tokenizer) {true_vocab}", "use a consistent tokenizer"))
                out.write(flat.tobytes())
                lengths.append(chunk_lengths)
                bar.update(int(flat.size), len(chunk_lengths))
            out.flush()
            os.fsync(out.fileno())
        all_lengths = np.concatenate(lengths) if lengths else np.zeros(0, dtype=np.int64)
        if all_lengths.size == 0:
            raise ConfigError(Problem(meta["source_key"], meta["source"], "holds no documents", "point it at non-empty data"))
        offsets = np.zeros(all_lengths.size + 1, dtype=np.int64)
        np.cumsum(all_lengths, out=offsets[1:])
        np.save(tmp / OFFSETS, offsets)
        meta = {
            **meta,
            "format": STORE_FORMAT,
            "dtype": dtype.name,
            "true_vocab": true_vocab,
            "eos_id": eos,
            "bos_id": bos,
            "num_documents": int(all_lengths.size),
            "num_tokens": int(offsets[-1]),
            "max_token_id": max_token_id,  # read by preflight's data_vocab check
            "tokenize_workers": workers,
            "build_seconds": round(time.perf_counter() - started, 3),
            "bad_records": bad.summary() if bad is not None else "not tracked",
            "bad_record_counts": dict(bad.counts) if bad is not None else {},
        }
        with (tmp / META).open("w") as f:
            json.dump(meta, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        os.rename(tmp, final)  # the store appears complete, or not at all
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.filename is None:
            e.filename = str(tmp)  # a write that fails (a full disk) names no file: the store being built
        raise
    finally:
        bar.close()
    return TokenStore.open(final)


def ensure_store(src, data_cfg, tokenizer, progress: bool = True) -> tuple[TokenStore, bool]:
    """The cached store for this source, tokenizer and policy: reused when complete, else built.
    Returns (store, built_now)."""
    from tinytrain.data import sources
    from tinytrain.data.bad_records import BadRecords
    from tinytrain.data.tokenizer import fingerprint

    tokenizer_fp = fingerprint(tokenizer)
    source_fp = sources.fingerprint(src)
    key = store_key(source_fp, tokenizer_fp, data_cfg.append_eos, data_cfg.prepend_bos)
    root = Path(data_cfg.cache_dir) / "stores"
    final = root / key
    if (final / META).exists():
        return TokenStore.open(final, key="data.cache_dir"), False
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ConfigError(Problem("data.cache_dir", data_cfg.cache_dir, f"cannot create {root}: {e.strerror}", "set data.cache_dir to a writable folder")) from e
    with BuildLock(root / f"{key}.lock", f"token store {key}"):
        if (final / META).exists():  # another process built it while this one waited for the lock
            return TokenStore.open(final, key="data.cache_dir"), False
        for stale in root.glob(f".{key}.tmp-*"):  # left by a build that was killed; never used
            shutil.rmtree(stale, ignore_errors=True)
        bad = BadRecords(data_cfg.bad_records, src.key)
        meta = {
            "store_key": key,
            "source_key": src.key,
            "source": src.describe(),
            "source_fingerprint": source_fp,
            "tokenizer": str(tokenizer.name_or_path),
            "tokenizer_fingerprint": tokenizer_fp,
            "append_eos": data_cfg.append_eos,
            "prepend_bos": data_cfg.prepend_bos,
        }
        workers = default_workers() if data_cfg.tokenize_workers is None else data_cfg.tokenize_workers
        store = build(final, sources.documents(src, bad), tokenizer, meta, workers, progress, bad)
        if bad.total:
            log.warning("%s: %s", src.describe(), bad.summary())
        return store, True

"""The sample index of pretraining data, computed once and memory-mapped by every rank.

What the windows over a token store need grows with the corpus: each chosen document's start in the
token file and in the packed stream (8 bytes each per document), and each epoch's order of windows
(8 bytes per window; a mixture's: each source's order for each pass). Computed in every rank's RAM that is ~1.2 GiB per rank at 20B tokens. Here
the first process to need them (rank 0, or mode=prepare) computes them under the build lock and
writes them as .npy files beside the store (<store>/index/<key>/, or <data.cache_dir>/index/<key>/ where
the store's folder is read-only); every process, rank and DataLoader
worker maps them read-only, so the page cache holds one copy per machine and a rank touches only
the pages of the windows it reads. The arrays are exactly what the in-memory computation gave
(the same split, the same permutation), so batch order and resume are unchanged.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from pathlib import Path

import numpy as np

from tinytrain.data.build_lock import BuildLock
from tinytrain.errors import ConfigError, Problem

INDEX_FORMAT = 1
DONE = "index.json"


def split_indices(n: int, val_fraction: float, seed: int, what: str, source: str = "the source", smallest: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(train, validation) indices, sorted; at least one for training and `smallest` for validation."""
    if n < smallest + 1:
        raise ConfigError(
            Problem("data.val_fraction", val_fraction, f"{source} has {n} {what}; splitting off validation needs at least {smallest + 1}", "use more data, data.text_split=blank_lines, or a separate data.val_path")
        )
    order = np.random.default_rng(seed).permutation(n)
    n_val = min(max(smallest, round(n * val_fraction)), n - 1)
    return np.sort(order[n_val:]), np.sort(order[:n_val])


def index_root(cache_dir: str, store) -> Path:
    """Beside the store, so its index travels with it and a store named by data.store needs no
    cache folder; under data.cache_dir only where the store's folder cannot be written."""
    folder = Path(store.path)
    return folder / "index" if os.access(folder, os.W_OK) else Path(cache_dir) / "index"


def index_dir(cache_dir: str, store, *what) -> Path:
    """Keyed by the store (its key or folder, its size) and what the index depends on."""
    m = store.meta
    payload = [INDEX_FORMAT, m.get("store_key") or str(Path(store.path).resolve()), m["num_documents"], m["num_tokens"], *what]
    return index_root(cache_dir, store) / hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]


def _save(folder: Path, name: str, array: np.ndarray) -> None:
    tmp = folder / f".{name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with tmp.open("wb") as f:
            np.save(f, array)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, folder / name)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk's partial file would hold on to the space freed for the rerun
        raise


def _map(folder: Path, name: str) -> np.ndarray:
    return random_access(np.load(folder / name, mmap_mode="r"))


def random_access(array: np.ndarray) -> np.ndarray:
    """Tells the kernel a mapped array is read at random places (MADV_RANDOM): no readahead and
    no fault-around, so a window's read maps the few pages it touches, not 64 KiB around each."""
    import mmap

    handle = getattr(array, "_mmap", None)
    if handle is not None and hasattr(mmap, "MADV_RANDOM"):
        handle.madvise(mmap.MADV_RANDOM)
    return array


def window_starts(doc_ids: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(where each chosen document starts in the token file, where in the packed stream; one more: the end)."""
    doc_starts = offsets[doc_ids]
    lengths = offsets[doc_ids + 1] - doc_starts
    stream = np.zeros(len(doc_ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=stream[1:])
    return np.asarray(doc_starts, dtype=np.int64), stream


def window_docs(stream: np.ndarray, seq_len: int) -> np.ndarray:
    """The document (index into the chosen documents) each window of seq_len starts in."""
    n = max(0, (int(stream[-1]) - 1) // seq_len)
    return np.searchsorted(stream, np.arange(n, dtype=np.int64) * seq_len, side="right") - 1


def split_windows(store, val_fraction: float, seed: int, cache_dir: str, seq_len: int, source: str = "the source") -> dict[str, np.ndarray]:
    """train/val document starts, stream starts and window-start documents of a store split by
    val_fraction, mapped."""
    folder = index_dir(cache_dir, store, "split", val_fraction, seed, seq_len)
    names = tuple(f"{p}_{k}.npy" for p in ("train", "val") for k in ("doc_starts", "stream_starts", "window_docs"))
    if not (folder / DONE).exists():
        folder.mkdir(parents=True, exist_ok=True)
        with BuildLock(folder.with_name(f"{folder.name}.lock"), f"sample index {folder.name}"):
            if not (folder / DONE).exists():
                train, val = split_indices(store.num_documents, val_fraction, seed, "documents", source)
                for prefix, ids in (("train", train), ("val", val)):
                    doc_starts, stream = window_starts(ids, store.offsets)
                    _save(folder, f"{prefix}_doc_starts.npy", doc_starts)
                    _save(folder, f"{prefix}_stream_starts.npy", stream)
                    _save(folder, f"{prefix}_window_docs.npy", window_docs(stream, seq_len))
                    del doc_starts, stream
                (folder / DONE).write_text(json.dumps({"documents": store.num_documents, "train": len(train), "val": len(val)}))
    return {name.removesuffix(".npy"): _map(folder, name) for name in names}


def whole_store(store) -> tuple[np.ndarray, np.ndarray]:
    """Every document in order: the store's own offsets are both arrays (no copy)."""
    return store.offsets[:-1], store.offsets


class EpochOrders:
    """The permutation of an epoch's samples, np.random.default_rng([seed, *salt, epoch]).permutation(n),
    written once and mapped (or, with no folder, computed in memory, for data too small to need
    it): callable as orders(epoch). `salt` tells apart orders of one size and seed (a mixture's
    sources: their names' checksums)."""

    def __init__(self, folder: Path | None, num_samples: int, seed: int, salt: tuple[int, ...] = ()):
        self.folder, self.num_samples, self.seed, self.salt = folder, num_samples, seed, tuple(salt)
        self._mapped: tuple[int, np.ndarray] | None = None

    def __call__(self, epoch: int) -> np.ndarray:
        if self._mapped is not None and self._mapped[0] == epoch:
            return self._mapped[1]
        if self.folder is None:
            self._mapped = (epoch, self._permutation(epoch))
            return self._mapped[1]
        salt = "".join(f"-{s}" for s in self.salt)
        name = f"order-n{self.num_samples}-seed{self.seed}{salt}-epoch{epoch}.npy"
        if not (self.folder / name).exists():
            self.folder.mkdir(parents=True, exist_ok=True)
            with BuildLock(self.folder / f"{name}.lock", f"epoch {epoch} order"):
                if not (self.folder / name).exists():
                    _save(self.folder, name, self._permutation(epoch))
        self._mapped = (epoch, _map(self.folder, name))
        return self._mapped[1]

    def _permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, *self.salt, epoch]).permutation(self.num_samples)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_mapped": None}

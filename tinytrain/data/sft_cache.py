"""SFT samples and preference pairs tokenized once: cached like the token store and read by every
rank and every restart.

Rendering conversations through a chat template and tokenizing them with offsets is the slow part of
an SFT or preference start, and every rank of every (re)start did it again. The first process to
need a source's items builds them under the build lock (build_lock.py) and writes
<data.cache_dir>/<kind>/<key>/ (kind: sft or preference): per array field of the item (input_ids and
labels of a sample; chosen_ids, chosen_labels, rejected_ids, rejected_labels of a pair) the items'
arrays end to end and their offsets, and meta.json, into a temporary folder renamed into place when
complete; every other process (other ranks, a requeued job) reads them and tokenizes nothing. The
key covers the source (files, sizes, mtimes), the tokenizer and its chat template, and every option
that shapes an item: format, template, train_on, seq_len and too_long, BOS/EOS, the text field and
the bad-record policy.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from tinytrain.data.build_lock import BuildLock

CACHE_FORMAT = 2  # 2: one offsets array per field (a pair's two sides differ in length)

Item = TypeVar("Item")  # a dataclass whose fields are all 1-D int64 arrays (SftSample, PreferencePair)


def cache_key(source_fingerprint: str, tokenizer, data_cfg) -> str:
    from tinytrain.data.tokenizer import fingerprint

    d = data_cfg
    options = [d.format.value, d.chat_template.value, d.train_on.value, d.seq_len, d.too_long.value, d.prepend_bos, d.append_eos, d.text_field, d.bad_records.value]
    template = getattr(tokenizer, "chat_template", None) or ""
    payload = [CACHE_FORMAT, source_fingerprint, fingerprint(tokenizer), hashlib.sha256(str(template).encode()).hexdigest(), options]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]


def cache_folder(cache_dir: str, kind: str, key: str) -> Path:
    return Path(cache_dir) / kind / key


def _fields(item_type) -> list[str]:
    return [f.name for f in dataclasses.fields(item_type)]


def _write(final: Path, items: list, item_type, summary: str) -> None:
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        for name in _fields(item_type):
            arrays = [getattr(item, name) for item in items]
            offsets = np.zeros(len(items) + 1, dtype=np.int64)
            np.cumsum(np.fromiter((len(a) for a in arrays), dtype=np.int64, count=len(items)), out=offsets[1:])
            np.save(tmp / f"{name}.offsets.npy", offsets)
            np.save(tmp / f"{name}.npy", np.concatenate(arrays).astype(np.int64))
        (tmp / "meta.json").write_text(json.dumps({"format": CACHE_FORMAT, "items": len(items), "fields": _fields(item_type), "summary": summary}))
        os.rename(tmp, final)  # complete, or not there at all
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read(folder: Path, item_type) -> tuple[list, str]:
    meta = json.loads((folder / "meta.json").read_text())
    columns = {}
    for name in _fields(item_type):
        offsets, values = np.load(folder / f"{name}.offsets.npy"), np.load(folder / f"{name}.npy")
        columns[name] = [values[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    items = [item_type(**dict(zip(columns, arrays))) for arrays in zip(*columns.values())]
    return items, meta["summary"]


def cached_items(folder: Path, item_type: type[Item], build: Callable[[], tuple[list[Item], str]], what: str) -> tuple[list[Item], str, bool]:
    """(items, the build's summary line, built_now): read from `folder` (cache_folder) when cached,
    else built by `build` under the lock and written. A build that fails (bad records, no items)
    writes nothing."""
    root, key = folder.parent, folder.name
    if not (folder / "meta.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        with BuildLock(root / f"{key}.lock", f"{what} {key}"):
            if not (folder / "meta.json").exists():
                for stale in root.glob(f".{key}.tmp-*"):  # left by a killed build; never read
                    shutil.rmtree(stale, ignore_errors=True)
                items, summary = build()
                if items:
                    _write(folder, items, item_type, summary)
                return items, summary, True
    items, summary = _read(folder, item_type)
    return items, summary, False

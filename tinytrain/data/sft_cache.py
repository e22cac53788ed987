"""SFT samples tokenized once: cached like the token store and read by every rank and every restart.

Rendering conversations through a chat template and tokenizing them with offsets is the slow part of
an SFT start, and every rank of every (re)start did it again. The first process to need a source's
samples builds them under the build lock (build_lock.py) and writes
<data.cache_dir>/sft/<key>/{input_ids,labels,offsets}.npy and meta.json, into a temporary folder
renamed into place when complete; every other process (other ranks, a requeued job) reads them and
tokenizes nothing. The key covers the source (files, sizes, mtimes), the tokenizer and its chat
template, and every option that shapes a sample: format, template, train_on, seq_len and too_long,
BOS/EOS, the text field and the bad-record policy.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from tinytrain.data.build_lock import BuildLock
from tinytrain.data.sft import SftSample

CACHE_FORMAT = 1


def cache_key(source_fingerprint: str, tokenizer, data_cfg) -> str:
    from tinytrain.data.tokenizer import fingerprint

    d = data_cfg
    options = [d.format.value, d.chat_template.value, d.train_on.value, d.seq_len, d.too_long.value, d.prepend_bos, d.append_eos, d.text_field, d.bad_records.value]
    template = getattr(tokenizer, "chat_template", None) or ""
    payload = [CACHE_FORMAT, source_fingerprint, fingerprint(tokenizer), hashlib.sha256(str(template).encode()).hexdigest(), options]
    return hashlib.sha256(json.dumps(payload).encode()).hexdigest()[:16]


def _write(final: Path, samples: list[SftSample], summary: str) -> None:
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir(parents=True)
    try:
        lengths = np.fromiter((len(s.input_ids) for s in samples), dtype=np.int64, count=len(samples))
        offsets = np.zeros(len(samples) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        for name, array in (
            ("offsets.npy", offsets),
            ("input_ids.npy", np.concatenate([s.input_ids for s in samples]).astype(np.int64)),
            ("labels.npy", np.concatenate([s.labels for s in samples]).astype(np.int64)),
        ):
            np.save(tmp / name, array)
        (tmp / "meta.json").write_text(json.dumps({"format": CACHE_FORMAT, "samples": len(samples), "summary": summary}))
        os.rename(tmp, final)  # complete, or not there at all
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _read(folder: Path) -> tuple[list[SftSample], str]:
    meta = json.loads((folder / "meta.json").read_text())
    offsets, ids, labels = (np.load(folder / f"{name}.npy") for name in ("offsets", "input_ids", "labels"))
    samples = [SftSample(ids[a:b], labels[a:b]) for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist())]
    return samples, meta["summary"]


def cached_samples(cache_dir: str, key: str, build: Callable[[], tuple[list[SftSample], str]]) -> tuple[list[SftSample], str, bool]:
    """(samples, the build's summary line, built_now): read when cached, else built by `build` under
    the lock and written. A build that fails (bad records, no samples) writes nothing."""
    root = Path(cache_dir) / "sft"
    final = root / key
    if not (final / "meta.json").exists():
        root.mkdir(parents=True, exist_ok=True)
        with BuildLock(root / f"{key}.lock", f"SFT samples {key}"):
            if not (final / "meta.json").exists():
                for stale in root.glob(f".{key}.tmp-*"):  # left by a killed build; never read
                    shutil.rmtree(stale, ignore_errors=True)
                samples, summary = build()
                if samples:
                    _write(final, samples, summary)
                return samples, summary, True
    samples, summary = _read(final)
    return samples, summary, False

"""finetune.precompute_reference: the reference's log-probs of every preference pair, stored with
the pairs under <data.cache_dir>/reference_logps/<key>.npz.

The key is a digest of what the log-probs depend on: the tokenized pairs (train and validation,
in order), the tokenizer, the model's source (model.pretrained's files or checkpoint.init_from,
by name, size and modification time; the seed and shape of a model trained from scratch), the rows
preflight rewrites, the precision and the attention kernel. finetune.beta and the objective are not
in it, so a run with another beta reuses the file with no reference forward. The file holds numbers
only (numpy arrays, read with allow_pickle=False) and is written to a temporary name, then renamed.
A file that does not read (cut short by a copy, a disk that filled up) is logged by name and
counts as a miss: the log-probs are computed again and the file rewritten.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import zipfile
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)


def _file_identity(path: Path) -> list:
    st = path.stat()
    return [path.name, st.st_size, st.st_mtime_ns]


def model_source(model_cfg, init_from: str | None, seed: int) -> dict:
    """What the reference's weights come from, without reading them."""
    from omegaconf import OmegaConf

    source: dict = {"model": OmegaConf.to_container(model_cfg, resolve=True, enum_to_str=True)}
    pretrained = model_cfg.pretrained
    if pretrained and Path(pretrained).is_dir():
        source["pretrained_files"] = [_file_identity(f) for f in sorted(Path(pretrained).iterdir()) if f.is_file()]
    if init_from:
        source["init_from"] = [str(Path(init_from).resolve()), *_file_identity(Path(init_from))]
    if not pretrained and not init_from:
        source["seed"] = seed  # a model trained from scratch starts from the seeded initialisation
    return source


def pairs_digest(datasets) -> str:
    h = hashlib.sha256()
    for ds in datasets:
        h.update(f"{len(ds.pairs)}|".encode())
        for p in ds.pairs:
            for a in (p.chosen_ids, p.chosen_labels, p.rejected_ids, p.rejected_labels):
                h.update(np.ascontiguousarray(a, dtype=np.int64).tobytes())
                h.update(b"|")
    return h.hexdigest()


class ReferenceCache:
    def __init__(self, cache_dir: str | Path, key: str):
        self.key = key
        self.path = Path(cache_dir) / "reference_logps" / f"{key}.npz"

    @classmethod
    def for_run(cls, cache_dir, *, train, val, tokenizer_fingerprint: str, source: dict, precision: str, attention: str, rows_fixed) -> ReferenceCache:
        parts = {
            "pairs": pairs_digest((train, val)),
            "tokenizer": tokenizer_fingerprint,
            "source": source,
            "precision": precision,
            "attention": attention,
            "rows_fixed": [str(r) for r in rows_fixed],
        }
        key = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]
        return cls(cache_dir, key)

    def load_into(self, train, val) -> bool:
        """Attach the cached log-probs to the datasets; False when there is no usable file."""
        if not self.path.is_file():
            return False
        try:
            with np.load(self.path, allow_pickle=False) as f:
                cached = {k: f[k] for k in ("train", "val")}
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, KeyError) as e:
            log.warning("reference log-probs %s do not read (%s: %s); computing them again and rewriting the file", self.path, type(e).__name__, " ".join(str(e).split())[:200])
            return False
        if cached["train"].shape != (len(train), 2) or cached["val"].shape != (len(val), 2):
            log.warning("reference log-probs %s hold %s train / %s validation rows, not %d / %d; computing them again", self.path, cached["train"].shape, cached["val"].shape, len(train), len(val))
            return False
        train.ref_logps, val.ref_logps = cached["train"], cached["val"]
        return True

    def save(self, train, val) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.tmp{os.getpid()}")  # the same folder: the rename is atomic
        with open(tmp, "wb") as f:
            np.savez(f, train=train.ref_logps, val=val.ref_logps)
        os.replace(tmp, self.path)

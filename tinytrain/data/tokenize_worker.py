"""Tokenizes a chunk of documents into one flat id array plus per-document lengths.

Runs in spawned worker processes (one core each), so it imports only numpy and tokenizers and
rebuilds the tokenizer from its JSON (a worker starts in ~0.2 s). The same functions run in the
main process when data.tokenize_workers=0.
"""

from __future__ import annotations

import itertools
import os

import numpy as np

_worker: dict = {}


def init(tokenizer_json: str, eos_id: int | None, bos_id: int | None, dtype: str, single_thread: bool = True, parent_pid: int | None = None) -> None:
    if parent_pid is not None:  # a worker process: it must not outlive the build that started it
        from tinytrain.data.orphan_guard import die_with_parent

        die_with_parent(parent_pid)
    if single_thread:
        # One worker is one core: the Rust tokenizer's own thread pool would oversubscribe.
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_str(tokenizer_json)
    # A document's literal "</s>" or "<|im_end|>" is text, as sentencepiece encodes it, never the
    # special id: only tinytrain places BOS/EOS, at document boundaries.
    tokenizer.encode_special_tokens = True
    _worker.update(tokenizer=tokenizer, eos=eos_id, bos=bos_id, dtype=np.dtype(dtype))


def encode(texts: list[str]) -> tuple[np.ndarray, np.ndarray, int]:
    """(flat ids with BOS/EOS per document, lengths, largest id) for one chunk."""
    encodings = _worker["tokenizer"].encode_batch_fast(texts, add_special_tokens=False)
    return flatten([e.ids for e in encodings], _worker["eos"], _worker["bos"], _worker["dtype"])


def flatten(id_lists: list[list[int]], eos: int | None, bos: int | None, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, int]:
    content_lengths = np.fromiter(map(len, id_lists), dtype=np.int64, count=len(id_lists))
    content = np.fromiter(itertools.chain.from_iterable(id_lists), dtype=np.int64, count=int(content_lengths.sum()))
    largest = int(content.max()) if content.size else -1
    lengths = content_lengths + (eos is not None) + (bos is not None)
    if eos is None and bos is None:
        return content.astype(dtype), lengths, largest
    ends = np.cumsum(lengths)
    flat = np.empty(int(ends[-1]) if len(ends) else 0, dtype=dtype)
    is_content = np.ones(flat.size, dtype=bool)
    if bos is not None:
        starts = ends - lengths
        flat[starts] = bos
        is_content[starts] = False
        largest = max(largest, bos)
    if eos is not None:
        flat[ends - 1] = eos
        is_content[ends - 1] = False
        largest = max(largest, eos)
    flat[is_content] = content
    return flat, lengths, largest

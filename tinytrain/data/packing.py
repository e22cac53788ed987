"""Packing: fixed windows over a store's token stream (pretraining) and rows of whole samples (SFT),
with per-document position ids and labels that never cross a document boundary unless configured.

How document isolation reaches attention: position ids restart at 0 at every document and the model
gets them with no attention_mask and use_cache=False. transformers 5 turns restarting position ids
into a block-diagonal causal mask on sdpa/eager (masking_utils.find_packed_sequence_indices). On
flash_attention_2 it does so only for a batch of one row, so the module flattens a packed batch into
one row with the boundaries the collator computed (tinytrain/model/packed_attention.py). With a KV cache
or a 2-D attention mask, packed documents would silently attend to each other: training passes
neither. Verified against each document run alone in tests/unit/data/test_packing.py (sdpa, eager) and
tests/unit/model/test_flash_packing.py (transformers' flash dispatch with a CPU stand-in kernel).

Labels are already shifted (labels[t] is the target for input t).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np
import torch
from torch.utils.data import Dataset

from tinytrain.data.sample_index import random_access, window_starts
from tinytrain.data.sft import trained_tokens
from tinytrain.errors import TrainingStopped

IGNORE = -100
WHOLE = "whole store"  # PackedWindows over every document of the store, in order


class PackedWindows(Dataset):
    """Non-overlapping windows of seq_len inputs over the concatenation of `doc_ids` (in order).

    Window i covers stream tokens [i*L, (i+1)*L] (L inputs plus the next token for the last label),
    so documents longer than a window continue in the next one, and position ids restart at the
    window start too (a window starting mid-document sees that document from position 0)."""

    def __init__(
        self, store, doc_ids: np.ndarray | None, seq_len: int, isolate_documents: bool = True, predict_across_documents: bool = False, mapped: tuple[str, str] | str | None = None, vocab: int | None = None
    ):
        """`mapped`: where the document starts come from instead of `doc_ids`: WHOLE (every
        document, the store's own offsets) or the (doc starts, stream starts) .npy files of
        sample_index.py, mapped read-only here and again in each DataLoader worker (never pickled).
        `vocab`: len(tokenizer), which every id read must be below."""
        self.store = store
        self.vocab = vocab
        self.seq_len = seq_len
        self.isolate = isolate_documents
        self.predict_across = predict_across_documents
        self.mapped = mapped
        self._starts(None if doc_ids is None else np.asarray(doc_ids, dtype=np.int64))
        self.num_tokens = int(self.stream_starts[-1])
        self.n = max(0, (self.num_tokens - 1) // seq_len)

    def _starts(self, doc_ids: np.ndarray | None) -> None:
        # doc_starts: where each chosen document starts in the token file; stream_starts: ... and in
        # the packed stream (one more: its end).
        self.window_docs = None  # the document each window starts in (mapped index), else searched
        if self.mapped == WHOLE:
            self.doc_starts, self.stream_starts = self.store.offsets[:-1], self.store.offsets
        elif self.mapped is not None:
            self.doc_starts, self.stream_starts, self.window_docs = (random_access(np.load(f, mmap_mode="r")) for f in self.mapped)
        else:
            self.doc_starts, self.stream_starts = window_starts(doc_ids, self.store.offsets)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "doc_starts": None, "stream_starts": None, "window_docs": None} if self.mapped is not None else self.__dict__

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self.mapped is not None:
            self._starts(None)

    def __len__(self) -> int:
        return self.n

    def _read(self, start: int, stop: int, first_doc: int, last_doc: int) -> np.ndarray:
        """Stream tokens start .. stop - 1 (in documents first_doc .. last_doc): one pread of the
        token file (TokenStore.read) per run of documents that lie next to each other in it (all of
        them unless the validation split took one in between)."""
        stream = np.asarray(self.stream_starts[first_doc : last_doc + 2])
        lo, hi = np.maximum(start, stream[:-1]), np.minimum(stop, stream[1:])
        at = np.asarray(self.doc_starts[first_doc : last_doc + 1]) + lo - stream[:-1]
        end = at + hi - lo
        cuts = [0, *(np.flatnonzero(at[1:] != end[:-1]) + 1).tolist(), len(at)]
        pieces = [self.store.read(int(at[a]), int(end[b - 1])) for a, b in zip(cuts[:-1], cuts[1:])]
        return (pieces[0] if len(pieces) == 1 else np.concatenate(pieces)).astype(np.int64)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        if not 0 <= i < self.n:
            raise IndexError(i)
        start = i * self.seq_len
        pos = np.arange(start, start + self.seq_len + 1)
        # The window's documents from the one it starts in onward: a few neighbouring index entries
        # (a page or two of a mapped index), not a binary search per token over the whole index.
        first = int(self.window_docs[i]) if self.window_docs is not None else int(np.searchsorted(self.stream_starts, start, side="right")) - 1
        span = 64
        while True:
            local = np.asarray(self.stream_starts[first : first + span])
            if local[-1] > pos[-1] or first + span >= len(self.stream_starts):
                break
            span *= 4
        doc = first + np.searchsorted(local, pos, side="right") - 1
        tokens = self._read(start, start + self.seq_len + 1, int(doc[0]), int(doc[-1]))
        if self.vocab is not None and int(tokens.max()) >= self.vocab:
            # The preflight read the store's recorded largest id; a store edited or damaged since
            # would index past the embedding (a device-side assert on a GPU).
            raise TrainingStopped(
                f"{self.store.path}: token id {int(tokens.max())} in window {i} is not below len(tokenizer) {self.vocab}, though the store records its largest id as "
                f"{self.store.meta.get('max_token_id')}: its tokens changed after it was built. Build the store again (mode=prepare) and run again"
            )
        labels = tokens[1:].copy()
        if not self.predict_across:
            labels[doc[1:] != doc[:-1]] = IGNORE  # e.g. EOS -> the next document's first token
        item = {"input_ids": torch.from_numpy(tokens[:-1]), "labels": torch.from_numpy(labels)}
        if self.isolate:
            segment_start = np.maximum(self.stream_starts[doc[:-1]], start)
            item["position_ids"] = torch.from_numpy(pos[:-1] - segment_start)
        return item


def pack_rows(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Best-fit decreasing: samples, longest first, each into the row with the least room that
    still fits it. Deterministic. Every length must be <= capacity."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, row index), sorted
    for i in order:
        at = bisect.bisect_left(free, (lengths[i], -1))
        if at == len(free):
            rows.append([i])
            room, row = capacity - lengths[i], len(rows) - 1
        else:
            room, row = free.pop(at)
            rows[row].append(i)
            room -= lengths[i]
        if room > 0:
            bisect.insort(free, (room, row))
    return rows


class PackedSamples(Dataset):
    """Rows of whole SFT samples; each sample's position ids start at 0 and its last label is
    already -100, so no label crosses into the next sample."""

    def __init__(self, samples: Sequence, capacity: int):
        self.samples = samples
        self.rows = pack_rows([len(s.input_ids) for s in samples], capacity)
        self.lengths = [sum(len(samples[i].input_ids) for i in row) for row in self.rows]
        trained = trained_tokens(samples)
        self.labelled = np.array([trained[row].sum() for row in self.rows], dtype=np.int64)  # per row (StepTokens)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, r: int) -> dict[str, torch.Tensor]:
        parts = [self.samples[i] for i in self.rows[r]]
        return {
            "input_ids": torch.from_numpy(np.concatenate([p.input_ids for p in parts]).astype(np.int64)),
            "labels": torch.from_numpy(np.concatenate([p.labels for p in parts]).astype(np.int64)),
            "position_ids": torch.from_numpy(np.concatenate([np.arange(len(p.input_ids)) for p in parts])),
        }

"""What a model's forward leaves allocated on this CPU, per layer and token: the measurement
tests/unit/plan/test_activation_count.py and tests/integration/tp_activation_worker.py hold the
plan's activation count (tinytrain/plan/activations.py) to.

The allocator's bytes in use after a forward and the loss (glibc's mallinfo2: a CPU tensor is one
malloc, nothing is cached) at two depths and two lengths, so the embedding, the head, the loss and
anything fixed (autocast's weight copies) cancel; each the smaller of two runs (the allocator's own
bookkeeping moves a few hundred bytes). The backward's peak is the same count read after every
operator the backward runs (benchmarks/allocator_count.py's dispatch mode).
"""

from __future__ import annotations

import contextlib
import gc
import statistics

from benchmarks.allocator_count import OperatorPeak, allocated, has_mallinfo2  # noqa: F401 (has_mallinfo2: the tests' skip)

VOCAB = 256


@contextlib.contextmanager
def heap_frozen():
    """What is alive now (torch, transformers and the other imports; in a test worker, every module
    pytest collected) out of the collector's reach for the block (gc.freeze), as tinytrain's runs
    freeze their imports (tinytrain/cluster/import_gc.py): settled()'s full collection then walks only
    what the block allocates. It walked the whole heap before, 0.1-0.3 s a time, two a reading: over
    half of tp_activation_worker's 40 s. What the block allocates is collected as before, so every
    reading is the same. Thawed after, unless something had frozen the heap before (an in-process
    CLI run in the same test worker): the thaw cannot tell its objects from ours."""
    thawed = gc.get_freeze_count() == 0
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        if thawed:
            gc.unfreeze()


def settled() -> int:
    """allocated() once nothing is left to free: the collector run, a process group's collectives done."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
    gc.collect()
    return allocated()


def loss_with_kept(loss_of, autocast: bool, seq: int):
    """(the loss of a random batch, allocated() before its forward, the bytes it left allocated)."""
    import torch

    ids = torch.randint(0, VOCAB, (1, seq))
    batch = {"input_ids": ids, "labels": ids.roll(-1, 1)}
    before = settled()
    with torch.autocast("cpu", torch.bfloat16, enabled=autocast):
        loss = loss_of(batch)
    return loss, before, settled() - before


def kept_by_loss(loss_of, autocast: bool, seq: int) -> int:
    """Bytes `loss_of(batch)` (a training loss, labels pre-shifted) leaves allocated."""
    return loss_with_kept(loss_of, autocast, seq)[2]


def kept_and_peak_by_loss(loss_of, autocast: bool, seq: int) -> tuple[int, int]:
    """(bytes `loss_of(batch)` leaves allocated, the most allocated through its backward), both over
    what was allocated before the forward. Parameters' gradients are in the peak: fixed, they cancel
    between lengths."""
    loss, before, kept = loss_with_kept(loss_of, autocast, seq)
    with OperatorPeak() as peak:
        loss.backward()
    return kept, max(peak.most - before, kept)


def kept_after_forward(model, autocast: bool, seq: int) -> int:
    """Bytes a training forward of `model` and a plain cross-entropy leave allocated (the logits
    themselves dropped with the forward's output)."""
    import torch

    def loss_of(batch):
        logits = model(input_ids=batch["input_ids"]).logits
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), batch["labels"].reshape(-1))

    return kept_by_loss(loss_of, autocast, seq)


def per_layer_token(build, autocast: bool, seq: int = 256, repeats: int = 2) -> float:
    """`build(layers)`: a fresh model of that many layers, ready to train. Bytes per layer and token.
    Each of the four readings is the smaller of two runs, or with 3 or more the middle one: under a
    process group a collective's buffer freed on gloo's thread, early or late, moves one reading by
    ~0.4 MB either way (the least of three once read 0.36 MB low: 314 of 1024 B per token)."""
    pick = min if repeats < 3 else statistics.median_low
    kept = {(n, s): pick([kept_after_forward(build(n), autocast, s) for _ in range(repeats)]) for n in (1, 2) for s in (seq, 2 * seq)}
    return ((kept[2, 2 * seq] - kept[1, 2 * seq]) - (kept[2, seq] - kept[1, seq])) / seq

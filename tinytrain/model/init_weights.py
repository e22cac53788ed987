"""checkpoint.init_from: another run's weights, fitted to this run's tokenizer and padding."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from tinytrain.checkpoint.format import repad_vocab, unpad_vocab
from tinytrain.checkpoint.formats import format_of
from tinytrain.plan.start_points import InitPoint
from tinytrain.plan.vocab import VocabPlan

log = logging.getLogger(__name__)


def weights_for_run(init: InitPoint, names: list[str], vocab: VocabPlan, tokenizer) -> dict:
    """The init_from checkpoint's HF-model state dict (checked by the plan), resized to this
    run's tokenizer and re-padded for its tp."""
    path, meta = init.path, init.saved
    state = format_of(path).read_weights(Path(path), "checkpoint.init_from")
    if meta.get("finetune"):  # a LoRA run's checkpoint: its adapters merged into the base
        from tinytrain.checkpoint.lora_weights import merge_adapters

        state = merge_adapters(state, meta["finetune"])
    unpad_vocab(state, names, meta["true_vocab"])  # tolerate checkpoints saved padded
    old, new = meta["true_vocab"], vocab.true
    if new > old:
        added = tokenizer.convert_ids_to_tokens(list(range(old, new)))
        for name in names:
            w = state[name]
            state[name] = torch.cat([w, w.float().mean(0, keepdim=True).to(w.dtype).expand(new - old, -1)])
        log.warning("tokenizer changed: %d new rows mean-initialised in %s: %s", new - old, ", ".join(names), ", ".join(added))
    elif new < old:
        for name in names:
            state[name] = state[name][:new].clone()
        log.warning("tokenizer changed: dropped %d rows (ids %d..%d) from %s", old - new, new, old - 1, ", ".join(names))
    repad_vocab(state, names, vocab.padded)
    log.info("weights from %s (saved with tp %d, %d rows) -> %s", path, meta["tp"], meta["true_vocab"], vocab.describe())
    return state


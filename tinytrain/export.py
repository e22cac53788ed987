"""Hugging Face export: exactly len(tokenizer) embedding rows, config.vocab_size equal to it."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def export_hf(model, tokenizer, true_vocab: int, out_dir: Path) -> Path:
    """Unpad the (full, unsharded) model to the true vocab and save model + tokenizer.

    Resizes `model` in place: call it after training has finished with the weights.
    """
    padded = model.get_input_embeddings().weight.shape[0]
    if padded != true_vocab:
        model.resize_token_embeddings(true_vocab, mean_resizing=False)  # drops the padding rows
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    log.info("exported Hugging Face model to %s (vocab %d -> %d rows)", out_dir, padded, true_vocab)
    return out_dir

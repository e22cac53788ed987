"""Checkpoint vocab handling: gather, then unpad; re-pad for the current tp on load.

Checkpoints hold full (gathered) tensors with exactly `true_vocab` rows in the embedding and
lm_head, plus the metadata to check them against a later run: true and padded vocab, the
multiple and tp used, and the tokenizer fingerprint. Unpadding happens after gathering on
purpose: a tp shard of a padded table is a contiguous slice of rows, and trimming shards before
the gather drops real rows and shifts the rest (tests/integration/test_tensor_parallel.py shows it).
"""

from __future__ import annotations

import logging

import torch

from tinytrain.errors import ConfigError, Problem
from tinytrain.vocab import VocabPlan, unpad_rows

log = logging.getLogger(__name__)

# Lightning prefixes the HF model's parameter names with the LightningModule attribute.
MODULE_PREFIX = "model."


def vocab_param_names(model) -> list[str]:
    """Names (in `model.state_dict()`) of the input embedding and lm_head weights."""
    wanted = {id(model.get_input_embeddings()): "input", id(model.get_output_embeddings()): "output"}
    names = [f"{name}.weight" for name, module in model.named_modules() if id(module) in wanted]
    return sorted(set(names))


def unpad_vocab(state_dict: dict, names: list[str], true_vocab: int) -> None:
    for name in names:
        if name in state_dict and state_dict[name].shape[0] > true_vocab:
            state_dict[name] = unpad_rows(state_dict[name], true_vocab).clone()


def repad_vocab(state_dict: dict, names: list[str], padded: int) -> None:
    """Padding rows are zeros: their logits are sliced off before the loss and never sampled."""
    for name in names:
        w = state_dict[name]
        if w.shape[0] < padded:
            pad = torch.zeros(padded - w.shape[0], *w.shape[1:], dtype=w.dtype)
            state_dict[name] = torch.cat([w, pad])


def metadata(vocab: VocabPlan, tokenizer_fingerprint: str, model_name: str) -> dict:
    return {
        "true_vocab": vocab.true,
        "padded_vocab": vocab.padded,
        "vocab_multiple": vocab.multiple,
        "tp": vocab.tp,
        "tokenizer_fingerprint": tokenizer_fingerprint,
        "model": model_name,
    }


def read(path: str) -> dict:
    try:
        return torch.load(path, map_location="cpu", weights_only=False, mmap=True)
    except (OSError, RuntimeError) as e:
        raise ConfigError(Problem("checkpoint.init_from", path, f"cannot read checkpoint: {e}", "point it at a .ckpt file saved by tinytrain")) from e


def check_compatible(ckpt: dict, path: str, vocab: VocabPlan, fingerprint: str, allow_tokenizer_change: bool) -> dict:
    meta = ckpt.get("tinytrain")
    if meta is None:
        raise ConfigError(Problem("checkpoint.init_from", path, "has no tinytrain metadata (true vocab, tokenizer fingerprint)", "use a checkpoint saved by tinytrain, or model.pretrained for a Hugging Face folder"))
    if meta["tokenizer_fingerprint"] != fingerprint and not allow_tokenizer_change:
        raise ConfigError(
            Problem(
                "checkpoint.init_from",
                path,
                f"saved with another tokenizer (fingerprint {meta['tokenizer_fingerprint']}, {meta['true_vocab']} tokens) "
                f"than this run's (fingerprint {fingerprint}, {vocab.true} tokens)",
                "use the checkpoint's tokenizer, or set checkpoint.allow_tokenizer_change=true to keep rows by id and mean-initialise new ones",
            )
        )
    return meta


def weights_for_run(path: str, names: list[str], vocab: VocabPlan, fingerprint: str, allow_tokenizer_change: bool, tokenizer) -> dict:
    """The checkpoint's HF-model state dict, resized to this run's tokenizer and re-padded for its tp."""
    ckpt = read(path)
    meta = check_compatible(ckpt, path, vocab, fingerprint, allow_tokenizer_change)
    state = {k.removeprefix(MODULE_PREFIX): v for k, v in ckpt["state_dict"].items() if k.startswith(MODULE_PREFIX)}
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

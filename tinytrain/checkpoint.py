"""Checkpoint vocab handling: gather, then unpad; re-pad for the current tp on load.

Checkpoints hold full (gathered) tensors with exactly `true_vocab` rows in the embedding and
lm_head, plus the metadata to check them against a later run: true and padded vocab, the
multiple and tp used, and the tokenizer fingerprint. Unpadding happens after gathering on
purpose: a tp shard of a padded table is a contiguous slice of rows, and trimming shards before
the gather drops real rows and shifts the rest (tests/integration/test_tensor_parallel.py shows it).
"""

from __future__ import annotations

import logging
import re

import torch

from tinytrain.errors import ConfigError, Problem
from tinytrain.safe_load import load_file
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


def read(path: str, key: str = "checkpoint.init_from") -> dict:
    """The checkpoint, memory-mapped (tensors are read when touched), loaded without running code
    from it (safe_load.py). `key` names the setting that pointed at it in the error."""
    return load_file(path, key)


def tinytrain_metadata(ckpt: dict, path: str, key: str) -> dict:
    meta = ckpt.get("tinytrain")
    if meta is None:
        raise ConfigError(Problem(key, path, "has no tinytrain metadata (true vocab, tokenizer fingerprint)", "use a checkpoint saved by tinytrain, or model.pretrained for a Hugging Face folder"))
    return meta


def other_tokenizer(meta: dict, fingerprint: str, vocab: VocabPlan) -> str:
    return f"saved with another tokenizer (fingerprint {meta['tokenizer_fingerprint']}, {meta['true_vocab']} tokens) than this run's (fingerprint {fingerprint}, {vocab.true} tokens)"


def saved_shape(state_dict: dict) -> dict[str, int]:
    """The architecture numbers a checkpoint's weights show (a ZeRO-3 shard's empty tensors show none)."""
    found = {}
    layers = {int(m.group(1)) for k in state_dict if (m := LAYER_INDEX.search(k))}
    if layers:
        found["num_layers"] = max(layers) + 1
    for suffix, name, dim in (("embed_tokens.weight", "hidden_size", 1), ("layers.0.mlp.gate_proj.weight", "intermediate_size", 0), ("layers.0.self_attn.k_proj.weight", "key/value width (num_kv_heads x head dim)", 0)):
        tensor = next((v for k, v in state_dict.items() if k.endswith(suffix)), None)
        if tensor is not None and tensor.ndim == 2:
            found[name] = int(tensor.shape[dim])
    return found


LAYER_INDEX = re.compile(r"\.layers\.(\d+)\.")


def check_shape(ckpt: dict, path: str, key: str, shape) -> None:
    """A checkpoint of another model size would fail deep inside load_state_dict ("size mismatch"):
    compare the sizes while planning. `shape`: this run's ModelShape."""
    if shape is None or not isinstance(ckpt.get("state_dict"), dict):
        return
    ours = {"num_layers": shape.layers, "hidden_size": shape.hidden, "intermediate_size": shape.intermediate, "key/value width (num_kv_heads x head dim)": shape.kv_heads * shape.head_dim}
    saved = saved_shape(ckpt["state_dict"])
    differ = [name for name in saved if saved[name] != ours[name]]
    if differ:
        theirs = ", ".join(f"{n} {saved[n]}" for n in differ)
        this = ", ".join(f"{n} {ours[n]}" for n in differ)
        raise ConfigError(
            Problem(key, path, f"holds another model size: {theirs} (this run's model: {this})", "use the model settings it was trained with (model= and the model.* overrides in its run's config_resolved.yaml), or another checkpoint")
        )


def check_compatible(ckpt: dict, path: str, vocab: VocabPlan, fingerprint: str, allow_tokenizer_change: bool, shape=None) -> dict:
    """Weights for a new run (checkpoint.init_from): any tp, and another tokenizer when allowed."""
    meta = tinytrain_metadata(ckpt, path, "checkpoint.init_from")
    check_shape(ckpt, path, "checkpoint.init_from", shape)
    if meta["tokenizer_fingerprint"] != fingerprint and not allow_tokenizer_change:
        raise ConfigError(
            Problem(
                "checkpoint.init_from",
                path,
                other_tokenizer(meta, fingerprint, vocab),
                "use the checkpoint's tokenizer, or set checkpoint.allow_tokenizer_change=true to keep rows by id and mean-initialise new ones",
            )
        )
    return meta


def check_resumable(ckpt: dict, path: str, vocab: VocabPlan, fingerprint: str, model_name: str, shape=None) -> dict:
    """A run continuing from its checkpoint (`resume`): optimizer state included, so the same
    tokenizer, model and padded vocab (the optimizer's moments have the padded rows)."""
    meta = tinytrain_metadata(ckpt, path, "resume")
    fresh = "or start a new run from its weights: run.name=<new> checkpoint.init_from=<this checkpoint>"
    if meta["tokenizer_fingerprint"] != fingerprint:
        raise ConfigError(Problem("resume", path, other_tokenizer(meta, fingerprint, vocab), f"resume with the tokenizer it was trained with, {fresh} (checkpoint.allow_tokenizer_change=true for another tokenizer)"))
    if meta["model"] != model_name:
        raise ConfigError(Problem("resume", path, f"saved by model={meta['model']}, this run is model={model_name}", f"give a different run its own directory (run.name=<new>), {fresh}"))
    check_shape(ckpt, path, "resume", shape)
    if meta["padded_vocab"] != vocab.padded:
        raise ConfigError(
            Problem(
                "resume",
                path,
                f"saved with vocab padded to {meta['padded_vocab']} (multiple {meta['vocab_multiple']} x tp {meta['tp']}); this run pads to {vocab.padded} (multiple {vocab.multiple} x tp {vocab.tp}), and the optimizer state cannot be re-padded",
                f"resume with the same parallel.tp and model.vocab_multiple, {fresh}",
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

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

from tinytrain.checkpoint.safe_load import load_file
from tinytrain.errors import ConfigError, Problem

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


def module_weights(state_dict: dict) -> dict:
    """The HF model's weights of a Lightning state dict: Lightning's `model.` prefix removed, keys
    outside the model dropped."""
    return {k.removeprefix(MODULE_PREFIX): v for k, v in state_dict.items() if k.startswith(MODULE_PREFIX)}


def read(path: str, key: str = "checkpoint.init_from") -> dict:
    """A checkpoint file, memory-mapped (tensors are read when touched), loaded without running code
    from it (safe_load.py). `key` names the setting that pointed at it in the error. Other formats:
    formats.py's rows."""
    return load_file(path, key)


# The version of what a checkpoint's "tinytrain" metadata holds: raised when a field changes
# meaning or a reader needs one an older writer did not record. Checkpoints from before it was
# written count as 0; one from a newer tinytrain is refused (it was read as if this one wrote it).
METADATA_VERSION = 1


# What every reader takes from the metadata, written by every tinytrain since the first.
REQUIRED_METADATA = {"true_vocab": int, "padded_vocab": int, "vocab_multiple": int, "tp": int, "tokenizer_fingerprint": str, "model": str}


def tinytrain_metadata(ckpt: dict, path: str, key: str) -> dict:
    meta = ckpt.get("tinytrain")
    if meta is None:
        hf = "give a Hugging Face folder to checkpoint.path itself" if key == "checkpoint.path" else "model.pretrained for a Hugging Face folder"
        raise ConfigError(Problem(key, path, "has no tinytrain metadata (true vocab, tokenizer fingerprint)", f"use a checkpoint saved by tinytrain, or {hf}"))
    if not isinstance(meta, dict):
        raise ConfigError(Problem(key, path, f"its tinytrain metadata is a {type(meta).__name__}, not the table tinytrain writes", "use a checkpoint saved by tinytrain"))
    newer_problem = newer_metadata_problem(meta, path, key)
    if newer_problem:
        raise ConfigError(newer_problem)
    # A field missing or of another type failed later as a KeyError or TypeError, some in training.
    wrong = [f"{field} {'missing' if field not in meta else repr(meta[field])[:40]}" for field, kind in REQUIRED_METADATA.items() if not isinstance(meta.get(field), kind) or isinstance(meta.get(field), bool)]
    if not isinstance(ckpt.get("state_dict", {}), dict):
        wrong.append(f"state_dict a {type(ckpt['state_dict']).__name__}")
    if wrong:
        raise ConfigError(Problem(key, path, f"its tinytrain metadata is not what tinytrain writes ({', '.join(wrong)})", "use a checkpoint saved by tinytrain"))
    return meta


def newer_metadata_problem(meta: dict, path: str, key: str) -> Problem | None:
    version = meta.get("metadata_version", 0)
    if not isinstance(version, int) or version <= METADATA_VERSION:
        return None
    written_by = f"tinytrain {meta['tinytrain_version']}" if meta.get("tinytrain_version") else "a newer tinytrain"
    return Problem(key, path, f"was saved by {written_by} (checkpoint metadata version {version}; this tinytrain reads up to {METADATA_VERSION})", "upgrade tinytrain to the version that saved it (pip install -U tinytrain-llm), or use a checkpoint this version saved")


def unpad_rows(tensor, true_vocab: int):
    """First `true_vocab` rows of an embedding or lm_head weight (a full, gathered tensor)."""
    if tensor.shape[0] < true_vocab:
        raise ValueError(f"tensor has {tensor.shape[0]} rows, fewer than the true vocab {true_vocab}")
    return tensor[:true_vocab]


LAYER_INDEX = re.compile(r"\.layers\.(\d+)\.")


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


def saved_layer_kinds(state_dict: dict) -> dict:
    """What the first layer's weight names show of the model family: its projections (names of
    `*_proj` weights), q/k/v biases, q/k head norms and norms per layer. Names only, so a ZeRO-3
    shard or a sharded checkpoint's meta tensors show them too; LoRA's adapters and peft's
    `base_layer` are looked through. {} where no layer-0 weight is saved (QLoRA's 4-bit base)."""
    names = set()
    for key in state_dict:
        if ".layers.0." not in key or "lora_" in key:
            continue
        names.add(key.split(".layers.0.", 1)[1].replace(".base_layer.", "."))
    if not names:
        return {}
    kinds = {
        "qkv_bias": any(n.endswith(("q_proj.bias", "qkv_proj.bias")) for n in names),
        "qk_norm": any(n.endswith("q_norm.weight") for n in names),
        "norms_per_layer": sum(n.endswith("norm.weight") and not n.endswith(("q_norm.weight", "k_norm.weight")) for n in names),
    }
    projections = sorted({n.rsplit(".", 2)[-2] for n in names if n.endswith("_proj.weight")})
    if projections:
        kinds["projections"] = projections
    return kinds


def repad_rows(tensor, true_vocab: int, padded: int):
    """A vocab table's rows (weights or Adam moments) for another padding: the real rows kept, the
    padding rows zero (their logits are never used, so their moments stay zero too)."""
    rows = tensor[:true_vocab]
    if padded > true_vocab:
        rows = torch.cat([rows, torch.zeros(padded - true_vocab, *tensor.shape[1:], dtype=tensor.dtype)])
    return rows


def name_optimizer_state(saved: dict, orders: list[list[str]], shapes: dict[str, tuple], vocab_names: list[str]) -> dict:
    """torch's optimizer state dict (parameters by index) keyed by parameter name instead. The
    index follows the optimizer's parameter order when tinytrain's optimizer saved it (its param
    groups), the module's named_parameters() when Lightning's FSDP path rekeyed it (fsdp_tp files
    before sharded saves): of `orders`, the first under which every saved moment has its
    parameter's shape (vocab rows aside) is used."""

    def fits(order: list[str]) -> bool:
        for i, entry in saved["state"].items():
            if i >= len(order):
                return False
            moment, shape = entry.get("exp_avg"), shapes[order[i]]
            if moment is not None and (tuple(moment.shape[1:]) != tuple(shape[1:]) or (order[i] not in vocab_names and moment.shape[0] != shape[0])):
                return False
        return True

    order = next((o for o in orders if fits(o)), None)
    if order is None:
        raise ValueError("the checkpoint's optimizer state matches none of this model's parameter orders")
    return {"state": {order[i]: dict(s) for i, s in saved["state"].items()}, "param_groups": [{**g, "params": [order[i] for i in g["params"]]} for g in saved["param_groups"]]}


def repad_optimizer_state(named: dict, vocab_names: list[str], true_vocab: int, padded: int) -> None:
    """The Adam moments of the vocab tables (a name-keyed optimizer state) re-padded in place."""
    for name in vocab_names:
        for key, value in named["state"].get(name, {}).items():
            if isinstance(value, torch.Tensor) and value.ndim >= 1 and value.shape[0] != padded:
                named["state"][name][key] = repad_rows(value, true_vocab, padded)

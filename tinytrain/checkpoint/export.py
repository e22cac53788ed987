"""Hugging Face export from a tinytrain checkpoint: exactly len(tokenizer) rows, and
config.vocab_size equal to it, whatever tp or strategy trained it."""

from __future__ import annotations

import copy
import logging
from pathlib import Path

import torch

from tinytrain.checkpoint.format import MODULE_PREFIX, unpad_vocab, vocab_param_names
from tinytrain.checkpoint.safe_load import load_file

log = logging.getLogger(__name__)


def export_state_dict(state_dict: dict, model_config, tokenizer, true_vocab: int, out_dir: Path) -> Path:
    """`state_dict`: the HF model's full weights (padded or not). Saves model + tokenizer."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model_config)
    config.vocab_size = true_vocab
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    names = vocab_param_names(model)
    unpad_vocab(state_dict, names, true_vocab)
    model.load_state_dict(state_dict, strict=True, assign=True)
    model.tie_weights()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out_dir))
    tokenizer.save_pretrained(str(out_dir))
    log.info("exported Hugging Face model to %s (%d vocab rows)", out_dir, true_vocab)
    return out_dir


def export_checkpoint(ckpt_path: Path, model_config, tokenizer, true_vocab: int, out_dir: Path) -> Path:
    ckpt = load_file(ckpt_path, "export")
    state = {k.removeprefix(MODULE_PREFIX): v for k, v in ckpt["state_dict"].items() if k.startswith(MODULE_PREFIX)}
    return export_state_dict(state, model_config, tokenizer, true_vocab, out_dir)

"""Whether a BOS token starts every document and SFT sample (`tokenizer.add_bos`), per tokenizer family.

Llama-2-family models were pretrained with `<s>` before every sequence, but their tokenizer.model
adds nothing by itself: fine-tuning one without BOS silently shifts it off its pretraining
distribution. So null (the default) follows the family: on for SentencePiece models with a BOS
piece, on for tokenizers whose own post-processor adds BOS (Llama-3, TinyLlama's tokenizer.json),
off otherwise (the bundled BPE, GPT-2-style tokenizers). The resolved value drives the token store,
SFT samples and the export (its tokenizer adds BOS, its chat template starts with it).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from omegaconf import OmegaConf, read_write

from tinytrain.data.tokenizer import tokenizer_kind
from tinytrain.errors import ConfigError, Problem


def resolve_add_bos(tok_cfg, data_cfg, tokenizer) -> tuple[bool, str]:
    """(add BOS, why), or a ConfigError when BOS is asked for and the tokenizer has none."""
    if tok_cfg.add_bos is not None:
        add, why = bool(tok_cfg.add_bos), f"tokenizer.add_bos={str(tok_cfg.add_bos).lower()}"
    elif data_cfg.prepend_bos:
        add, why = True, "data.prepend_bos=true"
    elif tokenizer.bos_token_id is None:
        return False, "the tokenizer has no BOS token"
    elif tokenizer_kind(str(tok_cfg.path)) == "sentencepiece":
        add, why = True, f"SentencePiece (Llama-2 family) models are pretrained with {tokenizer.bos_token} before every sequence"
    elif tokenizer("a").input_ids[:1] == [tokenizer.bos_token_id]:
        add, why = True, f"the tokenizer adds {tokenizer.bos_token} itself, as its models were trained"
    else:
        add, why = False, "the tokenizer does not add BOS itself (its family trains without)"
    if add and tokenizer.bos_token_id is None:
        raise ConfigError(Problem("tokenizer.add_bos", True, f"the tokenizer at {tok_cfg.path} has no BOS token", "set tokenizer.add_bos=false (and data.prepend_bos=false)"))
    return add, why


@dataclass(frozen=True)
class BosDecision:
    add: bool
    reason: str


def decide_bos(cfg, tokenizer) -> BosDecision:
    """The run's BOS decision, once, for the token store, SFT samples and the export; the plan
    carries it (plan.bos) and the config stays as composed."""
    return BosDecision(*resolve_add_bos(cfg.tokenizer, cfg.data, tokenizer))


def with_bos(data_cfg, add: bool):
    """`data_cfg` as the data stage reads it: a read-only copy whose data.prepend_bos is the run's
    decision (the token store's key, SFT samples and preference pairs follow it)."""
    settings = copy.deepcopy(data_cfg)
    with read_write(settings):
        settings.prepend_bos = add
    OmegaConf.set_readonly(settings, True)
    return settings

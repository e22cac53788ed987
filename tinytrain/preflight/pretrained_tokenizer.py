"""model.pretrained's own tokenizer against the run's: a model trained with another tokenizer reads
token id i from a row that belongs to another token. The plan compares them by the token -> id map
(tokenizer.vocab_fingerprint) and stops unless model.tokenizer_change=allow, which re-initialises
every embedding row (build: embedding_health.reinit_rows) instead of reusing rows by id.

Over the ids both have: tokens added at the end on either side (tokenizer.add_special_tokens, or
a folder exported with them) extend a tokenizer, they do not renumber it; new rows are mean-initialised.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinytrain.checkpoint.pretrained import local_folder
from tinytrain.config.schema import FinetuneMethod, TokenizerChange
from tinytrain.data.tokenizer import load_tokenizer, tokenizer_kind, vocab_fingerprint
from tinytrain.errors import ConfigError, Problem


@dataclass(frozen=True)
class TokenizerMatch:
    configured: str  # tokenizer.path, its fingerprint and size
    pretrained: str | None  # model.pretrained's own tokenizer, described the same way (None: none found)
    status: str  # "same" | "differs" | "unchecked"
    reason: str  # why unchecked, or what allow does
    reinit_rows: bool  # every embedding row re-initialised when the model is built

    def line(self) -> str:
        if self.status == "same":
            return f"model.pretrained's own tokenizer is the run's ({self.configured}): {self.reason}"
        if self.status == "unchecked":
            return f"model.pretrained's tokenizer could not be checked against the run's ({self.configured}): {self.reason}"
        return f"model.pretrained was trained with {self.pretrained}, this run uses {self.configured}: {self.reason}"

    def to_dict(self) -> dict:
        return asdict(self)


def describe(path: str, tok) -> str:
    return f"{path} (vocab fingerprint {vocab_fingerprint(tok)}, {len(tok)} tokens)"


def check(cfg, tokenizer) -> TokenizerMatch | None:
    """The comparison for the plan (None without model.pretrained); raises the refusal. `tokenizer`:
    the run's (special tokens added)."""
    m = cfg.model
    if not m.pretrained:
        return None
    configured = describe(str(cfg.tokenizer.path), tokenizer)
    folder = local_folder(m.pretrained)
    if folder is None:
        return TokenizerMatch(configured, None, "unchecked", "the hub id's files are not in the hub cache yet (training downloads them and checks)", False)
    if tokenizer_kind(str(folder)) == "missing":
        return TokenizerMatch(configured, None, "unchecked", "its folder has no tokenizer (tokenizer.json, tokenizer_config.json or tokenizer.model); make sure tokenizer.path is the one it was trained with", False)
    try:
        own = load_tokenizer(str(folder))
    except ConfigError as e:
        return TokenizerMatch(configured, None, "unchecked", f"its tokenizer does not load ({e.problems[0].message})", False)
    pretrained = describe(f"{m.pretrained} (its own tokenizer)", own)
    shared = min(len(own), len(tokenizer))
    if vocab_fingerprint(own, shared) == vocab_fingerprint(tokenizer, shared):
        extra = f"; the run adds {len(tokenizer) - shared} token(s) after them" if len(tokenizer) > shared else ""
        return TokenizerMatch(configured, pretrained, "same", f"ids 0-{shared - 1} are the same tokens{extra}", False)
    if m.tokenizer_change == TokenizerChange.refuse:
        raise ConfigError(
            Problem(
                "model.pretrained",
                m.pretrained,
                f"ships its own tokenizer, {pretrained}, not this run's tokenizer.path={configured}: every token id would read another token's embedding row",
                f"train with the model's tokenizer (tokenizer=hf tokenizer.path={m.pretrained}), or set model.tokenizer_change=allow to re-initialise every embedding row instead of reusing them by id",
            )
        )
    if cfg.finetune.method != FinetuneMethod.full:
        raise ConfigError(Problem("model.tokenizer_change", "allow", f"re-initialises every embedding row, and finetune={cfg.finetune.method.value} keeps them frozen (they would never train)", "use finetune=full with another tokenizer, or the model's own tokenizer under LoRA"))
    return TokenizerMatch(configured, pretrained, "differs", "model.tokenizer_change=allow: every embedding row is re-initialised as an added token's, none reused by id", True)

"""Tokenizer loading, added special tokens, and the tokenizer fingerprint.

`len(tokenizer)` (added tokens included) is the true vocab everywhere; `tokenizer.vocab_size`
ignores added tokens and is never used.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from pathlib import Path

from tinytrain.errors import ConfigError, Problem

log = logging.getLogger(__name__)

# Encoded by both our loader and sentencepiece itself: transformers has silent loading traps for
# bare .model files (a 3-token tokenizer, or one without the word-boundary prefix).
SENTENCEPIECE_PROBE = "Hello world, this is tinytrain. 12345 ünïcödé"


def tokenizer_kind(path: str) -> str:
    """'hf' (tokenizer.json folder or file), 'sentencepiece' (tokenizer.model), or 'hub' (an id)."""
    p = Path(path)
    if p.is_file():
        return "sentencepiece" if p.suffix == ".model" else "hf"
    if p.is_dir():
        if (p / "tokenizer.json").exists() or (p / "tokenizer_config.json").exists():
            return "hf"
        if (p / "tokenizer.model").exists():
            return "sentencepiece"
        return "missing"
    looks_like_hub_id = path.count("/") == 1 and not path.startswith((".", "/", "~")) and not p.suffix
    return "hub" if looks_like_hub_id else "missing"


def check_tokenizer_path(path: str) -> Problem | None:
    kind = tokenizer_kind(path)
    if kind != "missing":
        return None
    p = Path(path)
    what = "folder has no tokenizer.json, tokenizer_config.json or tokenizer.model" if p.is_dir() else "no such file or folder"
    return Problem(
        "tokenizer.path",
        path,
        what,
        "point tokenizer.path at a tokenizer folder, a tokenizer.model file, or a hub id like org/name "
        "(e.g. tokenizer=llama2 tokenizer.path=../shared/data/llama2-tokenizer)",
    )


@functools.lru_cache(maxsize=8)
def load_tokenizer(path: str, add_special_tokens: tuple[str, ...] = ()):
    """The tokenizer a run trains with, special tokens added. Cached: the vocab resolver, the
    plan and the trainer all call this."""
    problem = check_tokenizer_path(path)
    if problem:
        raise ConfigError(problem)
    kind = tokenizer_kind(path)
    if kind == "sentencepiece":
        tok = _load_sentencepiece(Path(path))
    else:
        tok = _load_hf(path, kind)
    if add_special_tokens:
        from transformers import AddedToken

        added = tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in add_special_tokens], special_tokens=True)
        log.debug("added %d special tokens to the tokenizer", added)
    if tok.pad_token is None:
        # Padded collation needs a pad id; the pad positions are masked out of the loss.
        tok.pad_token = tok.eos_token if tok.eos_token is not None else tok.unk_token
    if tok.eos_token is None:
        raise ConfigError(Problem("tokenizer.path", path, "tokenizer has no EOS token", "use a tokenizer that defines eos_token"))
    return tok


# tokenizer_config.json classes that are the generic tokenizers-backed class: loading them
# directly skips AutoTokenizer's class lookup (a third of a plan's own time).
GENERIC_CLASSES = {"TokenizersBackend", "PreTrainedTokenizerFast"}


def _tokenizer_class(folder: Path) -> str | None:
    config = folder / "tokenizer_config.json"
    if not config.is_file():
        return None
    return json.loads(config.read_text()).get("tokenizer_class")


def _load_hf(path: str, kind: str):
    try:
        if kind == "hf" and Path(path).is_file():
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast(tokenizer_file=path)
        if kind == "hf" and (Path(path) / "tokenizer.json").is_file() and _tokenizer_class(Path(path)) in GENERIC_CLASSES:
            from transformers import PreTrainedTokenizerFast

            return PreTrainedTokenizerFast.from_pretrained(path)
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises a bare Exception on a corrupt tokenizer.json
        where = "hub id (is the hub reachable? on an offline machine use a local folder)" if kind == "hub" else "file" if Path(path).is_file() else "folder"
        raise ConfigError(Problem("tokenizer.path", path, f"could not load tokenizer {where}: {e}", "point tokenizer.path at a local tokenizer folder")) from e


def _load_sentencepiece(path: Path):
    import shutil
    import tempfile

    import sentencepiece
    from transformers import LlamaTokenizer

    model_file = path if path.is_file() else path / "tokenizer.model"
    folder = model_file.parent
    if model_file.name != "tokenizer.model":
        # LlamaTokenizer(vocab_file=...) silently builds a 3-token tokenizer; from_pretrained on a
        # folder holding tokenizer.model is the path that matches sentencepiece.
        folder = Path(tempfile.mkdtemp(prefix="tinytrain-spm-"))
        shutil.copy(model_file, folder / "tokenizer.model")
    try:
        # sentencepiece first: on a file that is not a SentencePiece model transformers falls back
        # to other formats and fails asking for tiktoken.
        spm = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
    except (RuntimeError, OSError) as e:
        raise ConfigError(
            Problem("tokenizer.path", str(path), f"not a SentencePiece model: {' '.join(str(e).split())[:200]}", "point tokenizer.path at a Llama-style tokenizer.model, or a folder with tokenizer.json (tokenizer=hf)")
        ) from e
    tok = LlamaTokenizer.from_pretrained(str(folder))
    ours = tok.encode(SENTENCEPIECE_PROBE, add_special_tokens=False)
    theirs = spm.encode(SENTENCEPIECE_PROBE)
    if ours != theirs or len(tok) < spm.get_piece_size():
        raise ConfigError(
            Problem(
                "tokenizer.path",
                str(path),
                f"transformers loads this SentencePiece model differently from sentencepiece "
                f"(probe ids {ours[:6]}... vs {theirs[:6]}..., {len(tok)} vs {spm.get_piece_size()} pieces)",
                "convert the model to a tokenizer.json folder with the matching transformers version",
            )
        )
    return tok


def fingerprint(tok) -> str:
    """Identity of a tokenizer for checkpoints and token stores: its token -> id map (added
    tokens included) and its special tokens. Short sha256 hex."""
    payload = {
        "vocab": sorted(tok.get_vocab().items(), key=lambda kv: kv[1]),
        "special": {k: str(v) for k, v in sorted(tok.special_tokens_map.items())},
    }
    digest = hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode()).hexdigest()
    return digest[:16]


def load_from_config(tok_cfg):
    return load_tokenizer(str(tok_cfg.path), tuple(tok_cfg.add_special_tokens))

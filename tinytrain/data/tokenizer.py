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

# Encoded by both our loader and sentencepiece itself when a tokenizer.model loads: each string
# is a way transformers' own conversion has diverged (double, leading and trailing spaces, newlines,
# tabs, long whitespace runs, non-Latin scripts, byte fallback, digits).
SENTENCEPIECE_PROBES = (
    "Hello world, this is tinytrain. 12345 ünïcödé",
    "a  b",
    " leading space",
    "  two leading spaces",
    "trailing  ",
    "line one\nline two\n\n  indented",
    "tab\tseparated\t\tvalues",
    "def f(x):\n    return x  # four spaces" + " " * 20 + "and twenty",
    "日本語のテキスト、中文文本 и русский текст",
    "emoji 🙂 and math ∑ ½",
    "\r\n \u00a0nbsp",
)


EXACT_SENTENCEPIECE = "sentencepiece-exact-1"


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

        # Never a tokenizer folder's own code (nor transformers' prompt asking whether to run it).
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001 - the tokenizers library raises a bare Exception on a corrupt tokenizer.json
        where = "hub id (is the hub reachable? on an offline machine use a local folder)" if kind == "hub" else "file" if Path(path).is_file() else "folder"
        raise ConfigError(Problem("tokenizer.path", path, f"could not load tokenizer {where}: {e}", "point tokenizer.path at a local tokenizer folder")) from e


def _load_sentencepiece(path: Path):
    """A BPE tokenizer.model (Llama-2's) loads as the exact pipeline of sentencepiece_exact.py;
    other SentencePiece models through transformers. Either way a probe of edge strings must encode
    exactly as sentencepiece does, or loading stops."""
    import sentencepiece

    from tinytrain.data.sentencepiece_exact import model_proto, unsupported

    model_file = path if path.is_file() else path / "tokenizer.model"
    try:
        # sentencepiece first: on a file that is not a SentencePiece model transformers falls back
        # to other formats and fails asking for tiktoken.
        spm = sentencepiece.SentencePieceProcessor(model_file=str(model_file))
        proto = model_proto(model_file)
    except Exception as e:  # noqa: BLE001 - sentencepiece and protobuf raise their own types for a broken file
        raise ConfigError(
            Problem("tokenizer.path", str(path), f"not a SentencePiece model: {' '.join(str(e).split())[:200]}", "point tokenizer.path at a Llama-style tokenizer.model, or a folder with tokenizer.json (tokenizer=hf)")
        ) from e
    tok = _exact_sentencepiece(model_file, proto) if unsupported(proto) is None else _transformers_sentencepiece(model_file)
    for probe in SENTENCEPIECE_PROBES:
        ours = tok.encode(probe, add_special_tokens=False)
        theirs = spm.encode(probe)
        if ours != theirs or len(tok) < spm.get_piece_size():
            raise ConfigError(
                Problem(
                    "tokenizer.path",
                    str(path),
                    f"tinytrain encodes this SentencePiece model differently from sentencepiece ({probe!r}: ids {ours[:8]} vs {theirs[:8]}; "
                    f"{len(tok)} vs {spm.get_piece_size()} pieces; {unsupported(proto) or 'BPE'})",
                    "convert the model to a tokenizer.json folder that matches it and point tokenizer.path there (tokenizer=hf)",
                )
            )
    return tok


def _exact_sentencepiece(model_file: Path, proto):
    from transformers import PreTrainedTokenizerFast

    from tinytrain.data.sentencepiece_exact import build_backend

    spec = proto.trainer_spec

    def piece(i: int) -> str | None:
        return proto.pieces[i].piece if 0 <= i < len(proto.pieces) else None

    tok = PreTrainedTokenizerFast(tokenizer_object=build_backend(model_file), bos_token=piece(spec.bos_id), eos_token=piece(spec.eos_id), unk_token=piece(spec.unk_id))
    tok.name_or_path = str(model_file)
    tok.tinytrain_encoding = EXACT_SENTENCEPIECE
    return tok


def _transformers_sentencepiece(model_file: Path):
    import shutil
    import tempfile

    from transformers import LlamaTokenizer

    folder = model_file.parent
    if model_file.name != "tokenizer.model":
        # LlamaTokenizer(vocab_file=...) silently builds a 3-token tokenizer; from_pretrained on a
        # folder holding tokenizer.model is the path that matches sentencepiece.
        folder = Path(tempfile.mkdtemp(prefix="tinytrain-spm-"))
        shutil.copy(model_file, folder / "tokenizer.model")
    return LlamaTokenizer.from_pretrained(str(folder))


def fingerprint(tok) -> str:
    """Identity of a tokenizer for checkpoints and token stores: its token -> id map (added
    tokens included) and its special tokens. Short sha256 hex."""
    # The same vocab encoded another way (the exact SentencePiece pipeline vs transformers'
    # conversion) is another tokenizer for token stores and checkpoints.
    return _fingerprint(tok, getattr(tok, "tinytrain_encoding", None))


def _fingerprint(tok, encoding: str | None) -> str:
    payload = {
        "vocab": sorted(tok.get_vocab().items(), key=lambda kv: kv[1]),
        "special": {k: str(v) for k, v in sorted(tok.special_tokens_map.items())},
    }
    if encoding:
        payload["encoding"] = encoding
    digest = hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode()).hexdigest()
    return digest[:16]


# What changed for a checkpoint whose tokenizer an older tinytrain fingerprinted (earlier_fingerprints).
SENTENCEPIECE_NOW_EXACT = (
    "it was saved by a tinytrain from before the exact SentencePiece encoding of this tokenizer.model: the same file and "
    "token ids, but text that transformers' conversion split otherwise now tokenizes as sentencepiece does, so the corpus "
    "is encoded anew and its samples from here are not exactly the ones the old encoding gave"
)


def earlier_fingerprints(tok) -> dict[str, str]:
    """The fingerprints an older tinytrain recorded for this same tokenizer, each with what has
    changed since. A checkpoint carrying one holds the rows of the same token ids: it resumes and
    exports with the change said, where another tokenizer's is refused."""
    if getattr(tok, "tinytrain_encoding", None) != EXACT_SENTENCEPIECE:
        return {}
    # Before the exact pipeline the same file loaded through transformers, fingerprinted without an encoding.
    return {_fingerprint(tok, None): SENTENCEPIECE_NOW_EXACT}


def vocab_fingerprint(tok, ids: int | None = None) -> str:
    """Identity of a tokenizer's token -> id map alone (added tokens included), of its first `ids`
    ids if given: what decides which embedding row each token id reads. The same vocab encoded by
    another pipeline, or with other special-token roles, indexes the same rows."""
    vocab = sorted((kv for kv in tok.get_vocab().items() if ids is None or kv[1] < ids), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()[:16]


def load_from_config(tok_cfg):
    return load_tokenizer(str(tok_cfg.path), tuple(tok_cfg.add_special_tokens))


def tokenizer_problems(cfg) -> list[Problem]:
    problem = check_tokenizer_path(str(cfg.tokenizer.path))
    return [problem] if problem else []


def special_token_problems(cfg) -> list[Problem]:
    """Added special tokens must be new, distinct, non-blank strings: turning a word the tokenizer
    already has into a special token silently changes how every text containing it tokenizes."""
    tokens = list(cfg.tokenizer.add_special_tokens)
    key = "tokenizer.add_special_tokens"
    blank = [t for t in tokens if not str(t).strip()]
    if blank:
        return [Problem(key, tokens, f"holds a blank token {blank[0]!r}", "remove it; special tokens are strings like <|im_start|>")]
    repeated = sorted({t for t in tokens if tokens.count(t) > 1})
    if repeated:
        return [Problem(key, tokens, f"lists {', '.join(repeated)} more than once", "list each token once")]
    if not tokens or check_tokenizer_path(str(cfg.tokenizer.path)) is not None:
        return []
    try:
        base = load_tokenizer(str(cfg.tokenizer.path))
    except ConfigError:
        return []  # the tokenizer's own problem is reported when it loads
    special = set(base.all_special_tokens) | set(base.get_added_vocab())
    ordinary = [t for t in tokens if t in base.get_vocab() and t not in special]
    if ordinary:
        return [Problem(key, tokens, f"{', '.join(map(repr, ordinary))} is already an ordinary token of the tokenizer; as a special token it would no longer be split or merged in text", "add only new marker strings (e.g. <|im_start|>), or leave the word as it is")]
    return []

"""A Rust (tokenizers) pipeline that encodes exactly as `sentencepiece` does for a BPE
`tokenizer.model` (Llama-2's), so the token store, SFT and the export all use it at Rust speed.

transformers' own conversion diverges in two ways (`'a  b'`: sentencepiece [263, 29871, 289],
transformers [263, 259, 29890]):
- merges are ranked by piece id, so whitespace-only pieces ("▁▁", id 259) merge first; sentencepiece
  merges the pair whose result has the highest *score*, and whitespace-only pieces score -1e9 (last);
- its Metaspace pre-tokenizer adds the "▁" dummy prefix only when the text does not already start
  with a space (`' a'` loses its extra "▁").
Here merges are ranked by the merged piece's score, and the dummy prefix is a normalizer step
(Prepend + Replace, the original Llama-2 tokenizer.json layout): every text segment between added
special tokens is encoded as sentencepiece encodes that segment on its own.

Ties: sentencepiece breaks equal scores by position (leftmost first). The only equal-score merges
are between whitespace-only pieces; ranking "run + one ▁" merges longest-first and before "▁ + ▁"
reproduces leftmost accumulation ("▁" x 20 -> 16 + 4, as sentencepiece).
"""

from __future__ import annotations

from pathlib import Path

SPACE = "\u2581"
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def model_proto(model_file: Path):
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model_file.read_bytes())
    return proto


def unsupported(proto) -> str | None:
    """Why this model cannot be reproduced here (None when it can)."""
    if proto.trainer_spec.model_type != 2:  # BPE
        return "not a BPE model (unigram models need sentencepiece's own lattice)"
    norm = proto.normalizer_spec
    if norm.name != "identity" or norm.remove_extra_whitespaces or not norm.add_dummy_prefix:
        return f"normalizer {norm.name!r} (remove_extra_whitespaces={norm.remove_extra_whitespaces}, add_dummy_prefix={norm.add_dummy_prefix})"
    if proto.trainer_spec.treat_whitespace_as_suffix:
        return "treat_whitespace_as_suffix"
    return None


def ranked_merges(proto) -> list[tuple[str, str]]:
    """Every (a, b) with a, b and a+b pieces, ordered as sentencepiece would apply them."""
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    keyed = []
    for i, p in enumerate(proto.pieces):
        piece = p.piece
        if p.type != NORMAL or len(piece) < 2:
            continue
        whitespace = set(piece) == {SPACE}
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left not in vocab or right not in vocab:
                continue
            if whitespace:
                # After every scored merge; "run + ▁" (longest run first) before "▁ + ▁": leftmost accumulation.
                key = (1, len(right), -len(left))
            else:
                key = (0, -p.score, i)
            keyed.append((key, (left, right)))
    keyed.sort()
    return [pair for _, pair in keyed]


def build_backend(model_file: Path):
    """The tokenizers.Tokenizer for `model_file` (no post-processor: BOS is tinytrain's policy)."""
    from tokenizers import Tokenizer, decoders, normalizers
    from tokenizers.models import BPE

    proto = model_proto(model_file)
    vocab = {p.piece: i for i, p in enumerate(proto.pieces)}
    unk = next(p.piece for p in proto.pieces if p.type == UNKNOWN)
    model = BPE(vocab=vocab, merges=ranked_merges(proto), unk_token=unk, byte_fallback=proto.trainer_spec.byte_fallback, fuse_unk=True)
    backend = Tokenizer(model)
    backend.normalizer = normalizers.Sequence([normalizers.Prepend(SPACE), normalizers.Replace(" ", SPACE)])
    backend.pre_tokenizer = None
    backend.decoder = decoders.Sequence([decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    return backend

"""Builds the bundled tokenizer: byte-level BPE trained with HF `tokenizers` on the pydoc corpus.

The result is committed under tinytrain/assets/bundled_tokenizer/ so runs need no training step;
`python -m tinytrain.data.bundled_tokenizer` rebuilds it (deterministic, about a second).
"""

from __future__ import annotations

import sys
from pathlib import Path

from tinytrain.data.corpus import pydoc_documents

VOCAB_SIZE = 4096
SPECIAL_TOKENS = ["<s>", "</s>", "<pad>"]


def build(out_dir: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(pydoc_documents(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    out_dir.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(out_dir))
    return out_dir


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1] / "assets" / "bundled_tokenizer"
    print(f"wrote {build(target)}")

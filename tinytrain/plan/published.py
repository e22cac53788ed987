"""A model preset is the shape of a published model; trained with another tokenizer it is not that
model (`model=llama2_7b` with the bundled 4,096-token tokenizer has 6.51B parameters, not 6.74B).
The plan says so, with the published size and how to get the published model."""

from __future__ import annotations


def published_note(model_cfg, vocab_true: int, vocab_padded: int, params: int) -> str | None:
    """None when the preset names no published model, a pretrained folder gives the weights, or the
    run's tokenizer has the published vocab."""
    name, rows = model_cfg.published, model_cfg.published_vocab
    if not name or not rows or model_cfg.pretrained or vocab_true == rows:
        return None
    tables = 1 if model_cfg.tie_word_embeddings else 2
    published_params = params + (rows - vocab_padded) * model_cfg.hidden_size * tables
    return (
        f"the shape of {name}, not {name} itself: the run's tokenizer has {vocab_true:,} tokens, {name}'s {rows:,} "
        f"({params / 1e9:.2f}B parameters here, {published_params / 1e9:.2f}B published); for the published model "
        f"train with its own tokenizer (tokenizer=hf tokenizer.path=<its folder>) or fine-tune it (model.pretrained=<its folder>)"
    )

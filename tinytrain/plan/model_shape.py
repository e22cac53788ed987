"""Architecture numbers and the analytic parameter count (pure: no torch, no transformers).

`mode=plan` uses these so that planning an 8B model imports neither transformers' modeling
code nor allocates anything; tests check the count against a meta-device model.
"""

from __future__ import annotations

from dataclasses import dataclass

from tinytrain.config.schema import Arch


@dataclass(frozen=True)
class ModelShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int  # padded rows
    tied_embeddings: bool
    qkv_bias: bool

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def largest_layer_params(self) -> int:
        return max(self.vocab * self.hidden, self.intermediate * self.hidden)


def shape_from_config(model_cfg, padded_vocab: int) -> ModelShape:
    return ModelShape(
        hidden=model_cfg.hidden_size,
        layers=model_cfg.num_layers,
        heads=model_cfg.num_heads,
        kv_heads=model_cfg.num_kv_heads,
        intermediate=model_cfg.intermediate_size,
        vocab=padded_vocab,
        tied_embeddings=model_cfg.tie_word_embeddings,
        qkv_bias=model_cfg.arch == Arch.qwen2 or model_cfg.attention_bias,
    )


def shape_from_hf(config, padded_vocab: int) -> ModelShape:
    """A pretrained model's shape, with this run's padded vocab rows."""
    return ModelShape(
        hidden=config.hidden_size,
        layers=config.num_hidden_layers,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        intermediate=config.intermediate_size,
        vocab=padded_vocab,
        tied_embeddings=bool(config.tie_word_embeddings),
        qkv_bias=config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False)),
    )


def parameter_count(s: ModelShape) -> int:
    """Embeddings (+ lm_head unless tied) + per layer (q, k, v, o [+ q/k/v biases], gate/up/down,
    two RMSNorms) + the final norm."""
    kv = s.kv_heads * s.head_dim
    attention = 2 * s.hidden * s.hidden + 2 * s.hidden * kv + ((s.hidden + 2 * kv) if s.qkv_bias else 0)
    layer = attention + 3 * s.hidden * s.intermediate + 2 * s.hidden
    return s.vocab * s.hidden * (1 if s.tied_embeddings else 2) + s.layers * layer + s.hidden

"""Architecture numbers and the analytic parameter count (pure: no torch, no transformers).

`mode=plan` uses these so that planning an 8B model imports neither transformers' modeling
code nor allocates anything; tests check the count against a meta-device model.
"""

from __future__ import annotations

from dataclasses import dataclass

from tinytrain.config.schema import Arch
from tinytrain.plan.families import family, family_of_model_type, has_qkv_bias


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
    explicit_head_dim: int | None = None  # null: hidden // heads (Gemma-2 sets its own)
    norms_per_layer: int = 2
    qk_norm: bool = False  # a head_dim-wide RMSNorm on queries and one on keys per layer (Qwen3, Gemma-3)
    arch: Arch = Arch.llama  # what a layer keeps for backward differs by family (plan/activations.py)

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    @property
    def largest_layer_params(self) -> int:
        return max(self.vocab * self.hidden, self.intermediate * self.hidden)


def shape_from_config(model_cfg, padded_vocab: int) -> ModelShape:
    fam = family(model_cfg.arch)
    return ModelShape(
        hidden=model_cfg.hidden_size,
        layers=model_cfg.num_layers,
        heads=model_cfg.num_heads,
        kv_heads=model_cfg.num_kv_heads,
        intermediate=model_cfg.intermediate_size,
        vocab=padded_vocab,
        tied_embeddings=model_cfg.tie_word_embeddings,
        qkv_bias=has_qkv_bias(fam, model_cfg.attention_bias),
        explicit_head_dim=_unless_derived(model_cfg.head_dim, model_cfg.hidden_size, model_cfg.num_heads),
        norms_per_layer=fam.norms_per_layer,
        qk_norm=fam.qk_norm,
        arch=fam.arch,
    )


def shape_from_hf(config, padded_vocab: int) -> ModelShape:
    """A pretrained model's shape, with this run's padded vocab rows."""
    fam = family_of_model_type(config.model_type, "model.pretrained", getattr(config, "name_or_path", ""))
    return ModelShape(
        hidden=config.hidden_size,
        layers=config.num_hidden_layers,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        intermediate=config.intermediate_size,
        vocab=padded_vocab,
        tied_embeddings=bool(config.tie_word_embeddings),
        qkv_bias=has_qkv_bias(fam, bool(getattr(config, "attention_bias", False))),
        explicit_head_dim=_unless_derived(getattr(config, "head_dim", None), config.hidden_size, config.num_attention_heads),
        norms_per_layer=fam.norms_per_layer,
        qk_norm=fam.qk_norm,
        arch=fam.arch,
    )


def _unless_derived(head_dim: int | None, hidden: int, heads: int) -> int | None:
    """A head width only where it differs from hidden // heads (so equal shapes compare equal)."""
    return None if head_dim in (None, hidden // heads) else head_dim


def parameter_count(s: ModelShape) -> int:
    """Embeddings (+ lm_head unless tied) + per layer (q, k, v, o [+ q/k/v biases], gate/up/down,
    two RMSNorms, four for Gemma-2 and Gemma-3 [+ the q/k head norms of Qwen3 and Gemma-3]) + the
    final norm. Phi-3's fused qkv_proj and gate_up_proj hold
    the same numbers."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    attention = 2 * s.hidden * q + 2 * s.hidden * kv + ((q + 2 * kv) if s.qkv_bias else 0)
    layer = attention + 3 * s.hidden * s.intermediate + s.norms_per_layer * s.hidden + (2 * s.head_dim if s.qk_norm else 0)
    return s.vocab * s.hidden * (1 if s.tied_embeddings else 2) + s.layers * layer + s.hidden

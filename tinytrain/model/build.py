"""Model construction from config: Hugging Face classes of each family (llama, qwen2, mistral,
gemma2, phi3, qwen3, gemma3_text), no parallelism, no dtype.

Strategy code applies parallelism and precision; this module only knows architecture.
"""

from __future__ import annotations

import pickle
from pathlib import Path

from tinytrain.checkpoint.pretrained import pretrained_config
from tinytrain.checkpoint.safe_load import PICKLED_WEIGHTS_FIX, pickled_weights_message
from tinytrain.config.schema import Arch
from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.attention import TORCH_VARLEN, AttentionChoice
from tinytrain.plan.families import family


def hf_config(model_cfg, vocab_size: int, tokenizer):
    """A transformers config for `model_cfg` with `vocab_size` (padded) rows: the class of its
    family (model.arch is transformers' model_type)."""
    from transformers import AutoConfig

    common = dict(
        vocab_size=vocab_size,
        hidden_size=model_cfg.hidden_size,
        intermediate_size=model_cfg.intermediate_size,
        num_hidden_layers=model_cfg.num_layers,
        num_attention_heads=model_cfg.num_heads,
        num_key_value_heads=model_cfg.num_kv_heads,
        max_position_embeddings=model_cfg.max_position_embeddings,
        rms_norm_eps=model_cfg.rms_norm_eps,
        initializer_range=model_cfg.initializer_range,
        tie_word_embeddings=model_cfg.tie_word_embeddings,
        rope_parameters=rope_parameters(model_cfg.rope_theta, model_cfg.rope_scaling),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # With the KV cache on, packed documents silently attend to each other: training never uses it.
        use_cache=False,
    )
    return AutoConfig.for_model(model_cfg.arch.value, **{**common, **family_options(model_cfg)})


def rope_parameters(theta: float, scaling) -> dict:
    """transformers' rope_parameters: rope_theta plus model.rope_scaling (its type, factor, ...)."""
    return {"rope_type": "default", "rope_theta": float(theta), **(dict(scaling) if scaling else {})}


GEMMA3_PATTERN = 6  # Gemma-3: five sliding-window layers, then a global one


def family_options(m) -> dict:
    """The keys only some families' configs take (validate refused the others' settings)."""
    fam = family(m.arch)
    head_dim = m.head_dim or m.hidden_size // m.num_heads
    options = {}
    if fam.head_dim:
        options["head_dim"] = head_dim
    if fam.qkv_bias == "option":
        options["attention_bias"] = m.attention_bias
    if fam.sliding_window:
        options["sliding_window"] = m.sliding_window
        if m.sliding_window is None and m.arch in (Arch.gemma2, Arch.gemma3_text):
            # Every layer attends fully (layer_types below), yet their forward builds the windowed
            # mask whatever the layers are, and refuses a config without a window: one as long as
            # the context, which no layer reads.
            options["sliding_window"] = m.max_position_embeddings
    if m.arch == Arch.gemma2:
        # Gemma-2-2B scales queries by its head_dim (256); without a window every layer attends fully.
        options["query_pre_attn_scalar"] = head_dim
        if m.sliding_window is None:
            options["layer_types"] = ["full_attention"] * m.num_layers
    if m.arch == Arch.gemma3_text:
        # Gemma-3 scales queries by query_pre_attn_scalar (its head_dim for 1B and 4B); a global
        # layer after every sliding_window_pattern - 1 windowed ones, each kind with its own RoPE.
        pattern = m.sliding_window_pattern or GEMMA3_PATTERN
        options["query_pre_attn_scalar"] = head_dim
        options["layer_types"] = ["full_attention" if m.sliding_window is None or (i + 1) % pattern == 0 else "sliding_attention" for i in range(m.num_layers)]
        options["rope_parameters"] = {
            "full_attention": rope_parameters(m.rope_theta, m.rope_scaling),
            "sliding_attention": rope_parameters(m.rope_local_theta or m.rope_theta, None),
        }
    if m.arch in (Arch.qwen2, Arch.qwen3):
        # As published (Qwen2-0.5B, Qwen2.5-7B, Qwen3-0.6B/8B): the window setting names every layer;
        # transformers' default (28) would be written into an export of another depth. Full attention
        # either way: use_sliding_window stays false.
        options["max_window_layers"] = m.num_layers
    if m.arch == Arch.phi3:
        # The context its RoPE was trained at (longrope scales from it).
        options["original_max_position_embeddings"] = (m.rope_scaling or {}).get("original_max_position_embeddings", m.max_position_embeddings)
    return options


def model_config(model_cfg, vocab_rows: int, tokenizer):
    """The one transformers config of a run, for training (`vocab_rows`: the plan's padded vocab),
    the end-of-run export and the output modes (the export sets len(tokenizer) rows): model.pretrained's
    own, or one from the model group; either way with model.rope_scaling applied and without the
    KV cache."""
    if model_cfg.pretrained:
        config = pretrained_config(model_cfg.pretrained, bool(model_cfg.trust_remote_code))
        config.vocab_size = vocab_rows
        if model_cfg.rope_scaling:  # extending a pretrained model's context (preflight checked it)
            config.rope_parameters = rope_parameters(config.rope_parameters["rope_theta"], model_cfg.rope_scaling)
            config.max_position_embeddings = model_cfg.max_position_embeddings  # the extended context (plan/pretrained_shape.py)
    else:
        config = hf_config(model_cfg, vocab_rows, tokenizer)
    config.use_cache = False
    return config


def register(attention: AttentionChoice) -> None:
    """torch's varlen kernel is tinytrain's own attention implementation: transformers learns its name here."""
    if attention.implementation == TORCH_VARLEN:
        from tinytrain.model.varlen_attention import use_torch_varlen

        use_torch_varlen()


def build_model(model_cfg, config, attention: AttentionChoice):
    """Real weights: from config (pretraining) or from a local pretrained folder (fine-tuning),
    with embedding and lm_head resized to config.vocab_size (the padded size)."""
    from transformers import AutoModelForCausalLM

    register(attention)
    if model_cfg.pretrained:
        # The run's RoPE (model.rope_scaling extends the context) is built in: the weights load into
        # a model of `config`'s rope_parameters, the vocab rows resized below.
        try:
            model = AutoModelForCausalLM.from_pretrained(
                model_cfg.pretrained,
                attn_implementation=attention.implementation,
                rope_parameters=config.rope_parameters,
                max_position_embeddings=config.max_position_embeddings,
                trust_remote_code=model_cfg.trust_remote_code,
            )
        except pickle.UnpicklingError as e:
            # The plan checks the .bin files it can map; a legacy-format one is refused here.
            raise ConfigError(Problem("model.pretrained", model_cfg.pretrained, pickled_weights_message(Path(model_cfg.pretrained) / "pytorch_model.bin", e), PICKLED_WEIGHTS_FIX)) from None
        if model.get_input_embeddings().weight.shape[0] != config.vocab_size:
            # New rows get the mean of the old ones (transformers' mean_resizing).
            model.resize_token_embeddings(config.vocab_size, mean_resizing=True)
        model.config.use_cache = False
        return model
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention.implementation)

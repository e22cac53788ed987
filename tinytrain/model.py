"""Model construction from config: Hugging Face Llama-family classes, no parallelism, no dtype.

Strategy code applies parallelism and precision; this module only knows architecture.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from tinytrain.config.schema import Arch, Attention
from tinytrain.errors import ConfigError, Problem
from tinytrain.hardware import Hardware, describe


def hf_config(model_cfg, vocab_size: int, tokenizer):
    """A transformers config for `model_cfg` with `vocab_size` (padded) rows."""
    from transformers import LlamaConfig, Qwen2Config

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
        rope_parameters={"rope_type": "default", "rope_theta": float(model_cfg.rope_theta)},
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        # With the KV cache on, packed documents silently attend to each other: training never uses it.
        use_cache=False,
    )
    if model_cfg.arch == Arch.qwen2:
        return Qwen2Config(**common)
    return LlamaConfig(**common, attention_bias=model_cfg.attention_bias)


def pretrained_config(path: str):
    from transformers import AutoConfig

    from tinytrain.errors import ConfigError, Problem

    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:  # broken JSON, no model_type, an unknown architecture
        raise ConfigError(
            Problem("model.pretrained", path, f"cannot read its config.json: {' '.join(str(e).split())[:300]}", "point model.pretrained at a folder written by save_pretrained (config.json + weights)")
        ) from e


@dataclass(frozen=True)
class AttentionChoice:
    implementation: str
    reason: str


# flash-attn 2 runs on Ampere and newer only (its README: "Ampere, Ada, or Hopper GPUs").
FLASH_MIN_CAPABILITY = (8, 0)


def choose_attention(requested: Attention, flash_installed: bool, hardware: Hardware) -> AttentionChoice:
    """The attention implementation for `hardware` (detected, or named by hardware.gpu), with why.
    An explicit flash_attention_2 where it cannot run is a ConfigError naming the GPU and the fix."""
    where = describe(hardware)
    capable = not hardware.is_cpu and hardware.compute_capability >= FLASH_MIN_CAPABILITY
    if requested == Attention.auto:
        if capable and flash_installed:
            return AttentionChoice("flash_attention_2", f"flash-attn is installed and {where} has compute capability >= 8.0")
        if hardware.is_cpu:
            why = "no GPU"
        elif not capable:
            why = f"flash-attn 2 needs compute capability >= 8.0 and {where} has less"
        else:
            why = "flash-attn is not installed (pip install -e '.[gpu]')"
        return AttentionChoice("sdpa", f"PyTorch SDPA because {why}")
    if requested == Attention.flash_attention_2:
        if not capable:
            raise ConfigError(Problem("model.attention", requested.value, f"flash-attn 2 needs a GPU with compute capability >= 8.0 (A100, A800, H100, ...) and this run is on {where}", "use model.attention=sdpa (or auto, which picks SDPA here)"))
        if not flash_installed:
            return AttentionChoice("flash_attention_2", f"as configured; flash-attn is not installed on this machine: the one that trains needs it (pip install -e '.[gpu]')")
        return AttentionChoice("flash_attention_2", f"as configured ({where})")
    return AttentionChoice(requested.value, "as configured")


def flash_attn_installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


def build_model(model_cfg, config, attention: AttentionChoice):
    """Real weights: from config (pretraining) or from a local pretrained folder (fine-tuning),
    with embedding and lm_head resized to config.vocab_size (the padded size)."""
    from transformers import AutoModelForCausalLM

    if model_cfg.pretrained:
        model = AutoModelForCausalLM.from_pretrained(model_cfg.pretrained, attn_implementation=attention.implementation)
        if model.get_input_embeddings().weight.shape[0] != config.vocab_size:
            # New rows get the mean of the old ones (transformers' mean_resizing).
            model.resize_token_embeddings(config.vocab_size, mean_resizing=True)
        model.config.use_cache = False
        return model
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention.implementation)

"""What tinytrain knows about each model family (`model.arch`, transformers' model_type), pure:
the layout differences the parameter count, validation and the model builder need.

Each family is built by transformers' own *Config / *ForCausalLM classes (model/build.py); the
tensor-parallel plan is read from the built model, not from here (model/tensor_parallel.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tinytrain.config.schema import Arch, ModelConfig
from tinytrain.errors import ConfigError, Problem
from tinytrain.preflight import rope

# A Llama-family block's linear layers (Llama, Mistral, Qwen2, Gemma, Yi, TinyLlama name them alike).
LLAMA_PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PHI3_PROJECTIONS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")


@dataclass(frozen=True)
class Family:
    arch: Arch
    norms_per_layer: int  # RMSNorms in each decoder layer
    qkv_bias: str  # "always" (Qwen2), "option" (model.attention_bias), "never"
    sliding_window: bool  # model.sliding_window is passed to transformers' config
    head_dim: bool  # model.head_dim is (others derive hidden_size / num_heads)
    sdpa: bool = True  # transformers runs it on PyTorch SDPA
    logits_only: str | None = None  # why the loss must come from the model's own logits (no chunked / liger loss)
    projections: tuple[str, ...] = LLAMA_PROJECTIONS  # a block's linear layers (LoRA's default targets)
    qk_norm: bool = False  # an RMSNorm over each query and key head (head_dim weights each): Qwen3, Gemma-3


GEMMA2_SOFTCAP = "Gemma-2 soft-caps its logits inside the model's forward (final_logit_softcapping)"
FAMILIES = {
    Arch.llama: Family(Arch.llama, norms_per_layer=2, qkv_bias="option", sliding_window=False, head_dim=True),
    # Qwen2.5 publishes use_sliding_window false (full attention): tinytrain builds it so.
    Arch.qwen2: Family(Arch.qwen2, norms_per_layer=2, qkv_bias="always", sliding_window=False, head_dim=False),
    Arch.mistral: Family(Arch.mistral, norms_per_layer=2, qkv_bias="never", sliding_window=True, head_dim=True),
    # Gemma-2 normalises before and after both attention and MLP; its attention soft-capping has
    # no SDPA path in transformers (eager, or flash-attn 2 on a GPU).
    Arch.gemma2: Family(Arch.gemma2, norms_per_layer=4, qkv_bias="option", sliding_window=True, head_dim=True, sdpa=False, logits_only=GEMMA2_SOFTCAP),
    # Phi-3 fuses q/k/v into qkv_proj and gate/up into gate_up_proj: the same parameters as Llama's.
    Arch.phi3: Family(Arch.phi3, norms_per_layer=2, qkv_bias="never", sliding_window=True, head_dim=False, projections=PHI3_PROJECTIONS),
    # Qwen3: Qwen2 without the q/k/v biases and with RMSNorms on each query and key head, head_dim
    # its own (128 on a hidden size of 1024 for 0.6B); published with full attention.
    Arch.qwen3: Family(Arch.qwen3, norms_per_layer=2, qkv_bias="option", sliding_window=False, head_dim=True, qk_norm=True),
    # Gemma-3 (text): Gemma-2's four norms per layer plus q/k norms in place of attention
    # soft-capping (none of either soft-capping: SDPA runs it); five sliding-window layers with
    # their own RoPE base per global layer (model.sliding_window_pattern, model.rope_local_theta).
    Arch.gemma3_text: Family(Arch.gemma3_text, norms_per_layer=4, qkv_bias="option", sliding_window=True, head_dim=True, qk_norm=True),
}


def family(arch: Arch) -> Family:
    return FAMILIES[arch]


def family_of_model_type(model_type: str, key: str, value) -> Family:
    """The family of a pretrained model's config.json; another model type is refused by name."""
    for arch, fam in FAMILIES.items():
        if arch.value == model_type:
            return fam
    known = ", ".join(a.value for a in FAMILIES)
    raise ConfigError(Problem(key, value, f"is a {model_type!r} model; tinytrain builds the families {known}", "fine-tune a model of one of those families"))


def has_qkv_bias(fam: Family, attention_bias: bool) -> bool:
    return fam.qkv_bias == "always" or (fam.qkv_bias == "option" and attention_bias)


# transformers' tensor-parallel styles that tinytrain's FSDP2 x TP applies: Megatron's split, and
# norms replicated on every rank whose weight gradients are summed over the ranks (Qwen3's and
# Gemma-3's per-head q/k norms: each rank normalises its own heads).
TP_STYLES = ("colwise", "rowwise", "replicated_with_grad_allreduce")


def tp_problems(base_model_tp_plan: dict | None, family_name: str) -> list[Problem]:
    """A family's layer plan (transformers' `base_model_tp_plan`: module pattern -> style) is
    usable when every module is split column- or row-wise (or is a per-head norm); fused projections (Phi-3's qkv_proj is
    `colwise_gather_output`) would hand each rank a mix of q, k and v columns."""
    fix = "use parallel=ddp or zero2/zero3 for this model (no tensor parallelism)"
    if not base_model_tp_plan:
        return [Problem("parallel", "fsdp_tp", f"transformers has no tensor-parallel plan for the {family_name} family", fix)]
    other = {pattern: style for pattern, style in base_model_tp_plan.items() if style not in TP_STYLES}
    if other:
        listing = ", ".join(f"{p}: {s}" for p, s in other.items())
        return [Problem("parallel", "fsdp_tp", f"cannot shard the {family_name} family: transformers splits {listing}, not plainly column- or row-wise (fused projections)", fix)]
    return []


MAX_NORM_EPS = 1e-2  # published Llama-family models use 1e-5 or 1e-6
DEFAULT_MODEL = ModelConfig()  # model=tiny: the example values in fixes
# Model sizes that must be positive; checked first, since the divisibility checks divide by them.
POSITIVE_MODEL_SIZES = ("hidden_size", "num_layers", "num_heads", "num_kv_heads", "intermediate_size", "max_position_embeddings")


def model_problems(cfg) -> list[Problem]:
    m = cfg.model
    problems = [
        Problem(f"model.{key}", getattr(m, key), "must be a positive integer", f"use e.g. model.{key}={getattr(DEFAULT_MODEL, key)} (model=tiny's), or pick a model= option")
        for key in POSITIVE_MODEL_SIZES
        if getattr(m, key) < 1
    ]
    for key in ("rope_theta", "rms_norm_eps", "initializer_range"):
        if not (getattr(m, key) > 0 and math.isfinite(getattr(m, key))):
            problems.append(Problem(f"model.{key}", getattr(m, key), "must be positive and finite", f"use e.g. model.{key}={getattr(DEFAULT_MODEL, key)}"))
    if m.rms_norm_eps > MAX_NORM_EPS and math.isfinite(m.rms_norm_eps):
        # RMSNorm divides by sqrt(mean(x^2) + eps): an eps far above the activations' mean square
        # (about 1 at initialization) scales every normalized output toward zero, silently.
        problems.append(Problem("model.rms_norm_eps", m.rms_norm_eps, f"is above {MAX_NORM_EPS:g}: RMSNorm adds it to the activations' mean square (about 1), so it would shrink every normalized output", "use the model's published value (Llama: 1e-5 or 1e-6)"))
    if m.initializer_range > 1:  # transformers' config refuses it while building, after the plan
        problems.append(Problem("model.initializer_range", m.initializer_range, "must be at most 1 (the standard deviation of the initial weights; transformers refuses more)", f"use e.g. model.initializer_range={DEFAULT_MODEL.initializer_range}"))
    if problems:
        return problems
    if m.head_dim is None and m.hidden_size % m.num_heads:
        problems.append(Problem("model.num_heads", m.num_heads, f"must divide hidden_size({m.hidden_size})", "pick a head count that divides the hidden size, or set model.head_dim"))
    elif (m.head_dim or m.hidden_size // m.num_heads) % 2:
        # RoPE rotates pairs of a head's dimensions; transformers refuses an odd width while building.
        key, value = ("model.head_dim", m.head_dim) if m.head_dim else ("model.hidden_size", m.hidden_size)
        problems.append(Problem(key, value, f"gives heads {m.head_dim or m.hidden_size // m.num_heads} wide, and RoPE rotates pairs of a head's dimensions: the width must be even", "use an even model.head_dim, or a hidden_size that is an even multiple of num_heads"))
    problems += family_problems(m)
    if m.num_heads % m.num_kv_heads:
        problems.append(Problem("model.num_kv_heads", m.num_kv_heads, f"must divide num_heads({m.num_heads}) for grouped-query attention", "pick a KV head count that divides the head count"))
    if m.vocab_multiple < 1:
        problems.append(Problem("model.vocab_multiple", m.vocab_multiple, "must be >= 1", "use 64 (the default) or 128"))
    return problems


def family_problems(m) -> list[Problem]:
    """Keys that only some families' transformers classes take, and model.rope_scaling."""
    fam = family(m.arch)
    problems = []
    for key in ("head_dim", "sliding_window"):
        if getattr(m, key) is not None and getattr(m, key) < 1:
            problems.append(Problem(f"model.{key}", getattr(m, key), "must be a positive integer", f"use null for the default (model.{key}=null)"))
    if m.sliding_window is not None and not fam.sliding_window:
        problems.append(Problem("model.sliding_window", m.sliding_window, f"model.arch={m.arch.value} has no sliding-window attention", "use model.sliding_window=null, or a family that has it (mistral, gemma2, phi3, gemma3_text)"))
    if m.head_dim is not None and not fam.head_dim and m.head_dim * m.num_heads != m.hidden_size:
        problems.append(Problem("model.head_dim", m.head_dim, f"model.arch={m.arch.value} derives it as hidden_size / num_heads ({m.hidden_size} / {m.num_heads})", "use model.head_dim=null"))
    for key, what in (("sliding_window_pattern", "must be a positive integer (every Nth layer attends globally)"), ("rope_local_theta", "must be positive (the sliding-window layers' RoPE base)")):
        value = getattr(m, key)
        if value is None:
            continue
        if m.arch != Arch.gemma3_text:
            problems.append(Problem(f"model.{key}", value, f"only model.arch=gemma3_text has it (this is {m.arch.value})", f"use model.{key}=null"))
        elif not value > 0:
            problems.append(Problem(f"model.{key}", value, what, f"use null for the family's (model.{key}=null), e.g. Gemma-3's {6 if key == 'sliding_window_pattern' else 10000.0}"))
    if m.attention_bias and fam.qkv_bias == "never":
        problems.append(Problem("model.attention_bias", True, f"model.arch={m.arch.value} has no q/k/v biases", "use model.attention_bias=false"))
    return problems + rope.scaling_problems(m.rope_scaling)

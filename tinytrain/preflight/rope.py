"""RoPE scaling (`model.rope_scaling`) against the positions a run uses (`data.seq_len`), pure.

A model pretrained at N positions reaches further only through RoPE scaling: Llama-3.1 was
pretrained at 8192 and is extended to 131072 (rope_type llama3, factor 8). Two mistakes are seen
in the field: training beyond what the model (scaled or not) covers, and scaling whose
original_max_position_embeddings is not the context the weights were trained at, which shifts
every rotary frequency the weights learned.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from tinytrain.errors import Problem

# rope_type -> the keys transformers' rope_parameters need for it besides rope_theta.
ROPE_TYPES = {
    "linear": ("factor",),
    "dynamic": ("factor",),
    "yarn": ("factor",),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
}
EXAMPLE = "{rope_type:llama3,factor:8.0,low_freq_factor:1.0,high_freq_factor:4.0,original_max_position_embeddings:8192}"


def scaling_problems(scaling) -> list[Problem]:
    """What is wrong with a `model.rope_scaling` mapping on its own (null or {}: no scaling)."""
    if not scaling:
        return []
    key = "model.rope_scaling"
    if not isinstance(scaling, Mapping):
        return [Problem(key, scaling, "must be a mapping of rope_type, factor, ...", f"e.g. model.rope_scaling={EXAMPLE} (Llama-3.1's)")]
    value = dict(scaling)
    rope_type = value.get("rope_type")
    if rope_type not in ROPE_TYPES:
        return [Problem(key, value, f"rope_type must be one of {', '.join(ROPE_TYPES)}", f"e.g. model.rope_scaling={EXAMPLE} (Llama-3.1's), or null for no scaling")]
    problems = []
    missing = [k for k in ROPE_TYPES[rope_type] if k not in value]
    if missing:
        problems.append(Problem(key, value, f"rope_type {rope_type} needs {', '.join(missing)}", f"add {', '.join(missing)} (Llama-3.1's: {EXAMPLE})"))
    if "rope_theta" in value:
        problems.append(Problem(key, value, "rope_theta is model.rope_theta", "remove it from model.rope_scaling and set model.rope_theta"))
    factor = value.get("factor")
    if factor is not None and not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor >= 1):
        problems.append(Problem(f"{key}.factor", factor, "must be a finite number >= 1 (the context grows by it)", "e.g. 8.0 (Llama-3.1's)"))
    # inf / nan anywhere else (low_freq_factor, attention_factor, a longrope factor) makes every
    # rotary frequency inf or nan: the loss is nan from the first step.
    for name, item in value.items():
        numbers = list(item) if isinstance(item, Sequence) and not isinstance(item, str) else [item]
        if name != "factor" and any(isinstance(x, float) and not math.isfinite(x) for x in numbers):
            problems.append(Problem(f"{key}.{name}", item, "holds a value that is not finite (inf or nan)", f"use the finite values the model was published with (Llama-3.1's: {EXAMPLE})"))
    original = value.get("original_max_position_embeddings")
    if original is not None and not (isinstance(original, int) and original > 0):
        problems.append(Problem(f"{key}.original_max_position_embeddings", original, "must be a positive integer: the context the model was pretrained at", "e.g. 8192 (Llama-3.1's)"))
    return problems


def longrope_problems(scaling, head_dim: int) -> list[Problem]:
    """longrope scales each of the head's head_dim / 2 rotary frequencies by its own factor: a list
    of another length is a model of another head size (transformers only logs it)."""
    if not isinstance(scaling, Mapping) or scaling.get("rope_type") != "longrope":
        return []
    problems = []
    for name in ("short_factor", "long_factor"):
        factors = scaling.get(name)
        if factors is not None and len(list(factors)) != head_dim // 2:
            problems.append(
                Problem(f"model.rope_scaling.{name}", list(factors), f"has {len(list(factors))} factors; longrope needs one per rotary frequency, head_dim / 2 = {head_dim // 2} here", f"give {head_dim // 2} factors (the model's own config.json lists them), or check model.hidden_size / num_heads / head_dim")
            )
    return problems


def reach(max_positions: int, scaling) -> int:
    """Positions a model covers: its max_position_embeddings, or what scaling stretches its
    original context to, whichever is more (Qwen2.5 adds YaRN x4 on 32768 without raising
    max_position_embeddings; Llama-3.1's config says 131072, beyond 8192 x 8)."""
    if not scaling:
        return max_positions
    original = scaling.get("original_max_position_embeddings", max_positions)
    return max(max_positions, int(original * scaling.get("factor", 1.0)))


def describe(scaling) -> str:
    factor = f" x{scaling['factor']:g}" if "factor" in scaling else ""
    original = f" from {scaling['original_max_position_embeddings']}" if "original_max_position_embeddings" in scaling else ""
    return f"RoPE scaling {scaling['rope_type']}{factor}{original}"


def position_problems(seq_len: int, *, max_positions: int, scaling, trained_context: int | None, source: str) -> list[Problem]:
    """`data.seq_len` against the positions the model covers, and the scaling against the context
    its weights were trained at (`trained_context`: a pretrained model's; None from scratch).
    `source` names where max_positions comes from (model.max_position_embeddings, or a pretrained
    model's config.json)."""
    scaling = dict(scaling) if scaling else None
    problems = []
    original = scaling.get("original_max_position_embeddings") if scaling else None
    if original is not None and original > max_positions:
        problems.append(
            Problem(
                "model.rope_scaling.original_max_position_embeddings",
                original,
                f"above {source} ({max_positions}): scaling from a context longer than the model's extends nothing",
                f"use original_max_position_embeddings={trained_context}, the context model.pretrained was trained at" if trained_context else f"set it to the context the model was trained at (at most {max_positions}); the scaled context is factor x it",
            )
        )
    elif original is not None and trained_context is not None and original != trained_context:
        problems.append(
            Problem(
                "model.rope_scaling.original_max_position_embeddings",
                original,
                f"does not match the {trained_context} positions model.pretrained was trained at: every rotary frequency its weights learned would shift",
                f"use original_max_position_embeddings={trained_context}",
            )
        )
    covered = reach(max_positions, scaling)
    if seq_len > covered:
        if scaling:
            why = f"longer than the {covered} positions {describe(scaling)} reaches ({source} {max_positions})"
            fix = f"use data.seq_len<={covered}, or a larger rope_scaling factor"
        else:
            why = f"longer than {source} ({max_positions}) and RoPE has no scaling"
            fix = f"use data.seq_len<={max_positions}, or model.rope_scaling with original_max_position_embeddings={max_positions} (Llama-3.1's: {EXAMPLE})"
        problems.append(Problem("data.seq_len", seq_len, why, fix))
    return problems

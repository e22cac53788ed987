"""model.pretrained: the model's shape is its config.json's, not the model= preset's the config was
composed with (model=tiny unless another is named).

The plan read heads, tied embeddings and the family from cfg.model: a 32-head pretrained Llama was
refused tp 8 as "num_heads(6) of model=tiny", and a tied Qwen2 folder planned under fsdp_tp, which
refuses tied embeddings. The shape is adopted here, before validation, so every check and the
recorded config_resolved.yaml read the model that is trained. A shape key given on the command line
that disagrees with the folder is refused: the weights decide it, and it was silently ignored.
rope_theta and rms_norm_eps are the folder's too (the record said the preset's: a run started
from its checkpoint with those values made another model of the same weights).

One key is the run's to raise: a context extension (model.rope_scaling) records its new context as
max_position_embeddings, the scaled reach unless given (Llama-3.1 publishes 131072 beside its x8
scaling of 8192); left at the folder's, the export told every reader the extended model stops at
the old context.
"""

from __future__ import annotations

from tinytrain.errors import Problem, raise_if_any

# ModelConfig key -> the transformers config attribute it is read from.
SHAPE = {
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "intermediate_size": "intermediate_size",
    "max_position_embeddings": "max_position_embeddings",
    "tie_word_embeddings": "tie_word_embeddings",
    "head_dim": "head_dim",
    "sliding_window": "sliding_window",
}


OPTIONAL = ("head_dim", "sliding_window")  # None means something there: derived, no window


def pretrained_shape(config) -> dict:
    """The ModelConfig values of a transformers config (its family as `arch`)."""
    from tinytrain.plan.families import family_of_model_type

    heads = config.num_attention_heads
    values = {key: getattr(config, attr, None) for key, attr in SHAPE.items()}
    values["num_kv_heads"] = values["num_kv_heads"] or heads  # configs from before grouped-query attention
    values["tie_word_embeddings"] = bool(values["tie_word_embeddings"])
    if values["head_dim"] == config.hidden_size // heads:
        values["head_dim"] = None  # derived, as the presets leave it
    if not getattr(config, "use_sliding_window", True):
        values["sliding_window"] = None  # Qwen2 carries a window it does not use
    # rope_theta: transformers 5 keeps it in rope_parameters (per layer type for some families: left then)
    rope = getattr(config, "rope_parameters", None) or {}
    values["rope_theta"] = rope.get("rope_theta", getattr(config, "rope_theta", None))
    values["rms_norm_eps"] = getattr(config, "rms_norm_eps", None)
    values["arch"] = family_of_model_type(config.model_type, "model.pretrained", getattr(config, "name_or_path", "")).arch
    return values


def adopt(cfg, given: set[str]) -> None:
    """Set cfg.model's shape from model.pretrained's config (nothing without one, or where the
    folder is not readable: validation names that). `given`: the model.* keys the command line set."""
    from tinytrain.checkpoint.pretrained import pretrained_config, pretrained_path_problems

    m = cfg.model
    if not m.pretrained or pretrained_path_problems(m.pretrained):
        return
    values = pretrained_shape(pretrained_config(m.pretrained, m.trust_remote_code))
    if m.rope_scaling:
        values["max_position_embeddings"] = extended_positions(m, values["max_position_embeddings"], given)
    conflicts = [
        Problem(f"model.{key}", m[key], f"model.pretrained={m.pretrained} has {key}={values[key]}: a pretrained model's shape and attention are its config's (what its weights were trained with)", f"drop model.{key} from the command line")
        for key in sorted(given & values.keys())
        if m[key] != values[key] and (values[key] is not None or key in OPTIONAL)
    ]
    raise_if_any(conflicts)
    for key, value in values.items():
        if value is not None or key in OPTIONAL:
            m[key] = value


def extended_positions(m, folder_positions: int, given: set[str]) -> int:
    """max_position_embeddings of a run that extends a pretrained model's context: as given where it
    is at least the folder's (less is refused as a conflict), else what the scaling reaches."""
    from tinytrain.preflight import rope

    if "max_position_embeddings" in given and m.max_position_embeddings >= folder_positions:
        return m.max_position_embeddings
    if "max_position_embeddings" in given:
        return folder_positions
    return rope.reach(folder_positions, dict(m.rope_scaling))


def source(m) -> str:
    """Where cfg.model's shape came from, for messages: the folder, or the preset."""
    return f"model.pretrained={m.pretrained}" if m.pretrained else f"model={m.name}"


def given_model_keys() -> set[str]:
    """The model.* keys set on this command line (none where Hydra did not compose it)."""
    from tinytrain.cluster.overrides import task_overrides

    keys = (o.lstrip("+~").split("=", 1)[0] for o in task_overrides())
    return {k.removeprefix("model.") for k in keys if k.startswith("model.")}

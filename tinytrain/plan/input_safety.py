"""Inputs that would run foreign code, or fail only after compute was spent, refused in the plan:
a model or tokenizer folder that needs its own Python code, pretrained weights cut short, the
samples generated at each validation step, RoPE settings that make every frequency inf or nan,
BOS settings that contradict each other, and an export folder that publishing would replace."""

from __future__ import annotations

from pathlib import Path

from tinytrain.checkpoint.export_target import export_dir_problems
from tinytrain.checkpoint.pretrained import is_hub_id, local_folder
from tinytrain.checkpoint.remote_code import remote_code_problems, tokenizer_code_problems
from tinytrain.checkpoint.safe_load import PICKLED_WEIGHTS_FIX, pickled_weights_problem
from tinytrain.checkpoint.weight_files import weight_problems
from tinytrain.config.generate_checks import training_sample_problems
from tinytrain.config.schema import Mode
from tinytrain.errors import Problem
from tinytrain.preflight.rope import longrope_problems


def problems(cfg) -> list[Problem]:
    return pretrained_problems(cfg) + tokenizer_code_problems(str(cfg.tokenizer.path)) + training_sample_problems(cfg.generate, None if cfg.model.pretrained else cfg.model.max_position_embeddings) + rope_problems(cfg) + bos_problems(cfg) + export_problems(cfg)


def pretrained_problems(cfg) -> list[Problem]:
    m = cfg.model
    if not m.pretrained:
        return []
    folder = local_folder(m.pretrained) if is_hub_id(m.pretrained) else Path(m.pretrained)
    if folder is None or not (folder / "config.json").is_file():
        return []  # not cached yet / no config.json: reported by the model checks
    found = remote_code_problems("model.pretrained", folder, bool(m.trust_remote_code))
    weights = weight_problems(folder)
    if weights and weights[0].startswith("no weights"):
        # A plan needs only config.json (a login node may plan before the weights are copied); training needs them.
        if cfg.mode == Mode.train:
            found.append(Problem("model.pretrained", m.pretrained, "has a config.json but no weights (model.safetensors or pytorch_model.bin)", "copy the model's weight files into the folder, or point model.pretrained at a complete one"))
        return found
    damaged = weights
    if not any(folder.glob("*.safetensors")):  # transformers reads the pickled .bin files then
        for path in sorted(folder.glob("pytorch_model*.bin")):
            if (why := pickled_weights_problem(path)) is not None:
                found.append(Problem("model.pretrained", m.pretrained, why, PICKLED_WEIGHTS_FIX))
                break
    if damaged:
        found.append(
            Problem("model.pretrained", m.pretrained, f"its weights are not whole: {'; '.join(damaged[:3])}", "download or copy the model again (compare the files' sizes with their source), or point model.pretrained at a complete folder")
        )
    return found


def rope_problems(cfg) -> list[Problem]:
    m = cfg.model
    if m.num_heads < 1 or m.hidden_size < 1:
        return []  # reported by the model checks
    return longrope_problems(m.rope_scaling, m.head_dim or m.hidden_size // m.num_heads)


def bos_problems(cfg) -> list[Problem]:
    """data.prepend_bos=true asks for BOS before every document; tokenizer.add_bos=false forbids it,
    and the export's tokenizer would follow only one of them."""
    if cfg.tokenizer.add_bos is False and cfg.data.prepend_bos:
        return [Problem("tokenizer.add_bos", False, "contradicts data.prepend_bos=true (BOS before every document and sample)", "drop one of them: tokenizer.add_bos=true (or null) to train with BOS, or data.prepend_bos=false to train without")]
    return []


def export_problems(cfg) -> list[Problem]:
    """The end-of-run export publishes over export.dir, so it must be an export, empty or new."""
    if cfg.mode not in (Mode.train, Mode.plan, Mode.sbatch) or not cfg.trainer.export or not cfg.export.dir:
        return []
    return export_dir_problems("export.dir", Path(cfg.export.dir))

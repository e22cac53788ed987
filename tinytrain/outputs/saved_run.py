"""What mode=export|generate|eval start from: a checkpoint of a run (a step checkpoint, final.ckpt,
a DeepSpeed folder, from any strategy) with the configuration its run trained with, or an exported
Hugging Face folder.

`checkpoint.path` names it: a path, or `final` / `last` (the newest step checkpoint) of the run
in hydra.run.dir. A checkpoint's run is the folder holding its `checkpoints/` folder; its
config_resolved.yaml gives the model, tokenizer, data template and precision, so nothing is retrained
or re-specified. Checkpoints hold full, gathered tensors (fsdp_tp gathers before saving); a
DeepSpeed folder is consolidated into one state dict first (its files are checked for pickled code).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from omegaconf import OmegaConf

from tinytrain.checkpoint.export import checkpoint_state_dict, export_spec, model_from_state_dict
from tinytrain.checkpoint.export_target import partial_export_problems
from tinytrain.checkpoint.files import step_checkpoints
from tinytrain.checkpoint.format import tinytrain_metadata
from tinytrain.checkpoint.formats import CheckpointFormat, format_of
from tinytrain.checkpoint.lora_weights import merge_adapters
from tinytrain.checkpoint.pretrained import pretrained_config
from tinytrain.checkpoint.remote_code import announce, remote_code_problems
from tinytrain.checkpoint.resume import read_state
from tinytrain.config.resolvers import ASSETS
from tinytrain.config.schema import Config, DataFormat
from tinytrain.data.tokenizer import earlier_fingerprints, fingerprint, load_from_config
from tinytrain.errors import ConfigError, Problem, raise_if_any
from tinytrain.model import build
from tinytrain.plan.model_shape import shape_from_config, shape_from_hf
from tinytrain.plan.start_points import check_shape
from tinytrain.train.run_end import RunModel, export_dir_for

log = logging.getLogger(__name__)

KEY = "checkpoint.path"
RUN_CONFIG = "config_resolved.yaml"


@dataclass
class SavedRun:
    checkpoint: Path  # the file, DeepSpeed folder, or HF folder
    run_dir: Path | None  # the run that saved it (None for an HF folder from elsewhere)
    train_cfg: object | None  # that run's resolved config (None for an HF folder without one)
    tokenizer: object
    is_hf_folder: bool
    finetune: dict | None = None  # a LoRA run's adapters (checkpoint metadata): merged for inference


    def default_export_dir(self) -> Path:
        return export_dir_for(self.checkpoint, self.run_dir)

    @property
    def is_sft(self) -> bool:
        return self.train_cfg is not None and DataFormat(self.train_cfg.data.format) != DataFormat.text


def run_named() -> str:
    """How a command names the run whose `final` / `last` it reads."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return "in a multirun that is each job's own directory (<sweep dir>/<job number>), so give the checkpoints' paths instead (a sweep of checkpoint=<path>,<path>)"
    return "name the run with run.name=<run> (or hydra.run.dir=<run dir>)"


def locate(value: str | None, run_dir: Path) -> Path:
    """The checkpoint `checkpoint.path` names; an error naming the key, value and fix otherwise."""
    if not value:
        raise ConfigError(Problem(KEY, None, "this mode needs a checkpoint", "add checkpoint=<run>/checkpoints/step<N>.ckpt (or final.ckpt, a DeepSpeed checkpoint folder, an hf_export folder)"))
    checkpoints = run_dir / "checkpoints"
    if value == "final":
        path = checkpoints / "final.ckpt"
    elif value == "last":
        steps = step_checkpoints(checkpoints)
        if not steps:
            raise ConfigError(Problem(KEY, value, f"{checkpoints} holds no step checkpoint", f"{run_named()}, or give the checkpoint's path"))
        path = steps[0][1]
    else:
        path = Path(value)
    if not path.exists():
        raise ConfigError(Problem(KEY, value, f"{path} does not exist", f"give a checkpoint file or folder that exists; `final` and `last` are looked up in this command's run directory: {run_named()}"))
    # `final.ckpt` (or `.`) typed inside checkpoints/ (or an export): its run is found from its parents.
    return path.absolute()


def load(value: str | None, run_dir: Path, trust_remote_code: bool = False) -> SavedRun:
    """The checkpoint with its run's config and tokenizer (checked against the checkpoint's).
    `trust_remote_code`: this command's model.trust_remote_code; the saved run's is not read (a
    run copied from elsewhere would run its base folder's code on export, eval or generate)."""
    path = locate(value, run_dir)
    if format_of(path).format is CheckpointFormat.hf_export:
        return _hf_folder(path)
    source_run = path.parent.parent if path.parent.name == "checkpoints" else None
    if source_run is None:
        raise_if_any(partial_export_problems(KEY, path))  # no config.json, so not read as an export
    if source_run is None or not (source_run / RUN_CONFIG).is_file():
        raise ConfigError(Problem(KEY, str(path), f"is not inside a run's checkpoints/ folder next to its {RUN_CONFIG}, so its model and tokenizer are unknown", "give a checkpoint where its run saved it (<run>/checkpoints/...)"))
    train_cfg = run_config(source_run / RUN_CONFIG)
    if train_cfg.model.pretrained:
        raise_if_any(remote_code_problems("its run's model.pretrained", train_cfg.model.pretrained, trust_remote_code))
    train_cfg.model.trust_remote_code = trust_remote_code

    state = read_state(path, KEY)
    meta = tinytrain_metadata(state, str(path), KEY)
    # A checkpoint of another model than its run's config describes (copied between runs): the
    # same size check resume makes, before any weights are loaded.
    check_shape(state, str(path), KEY, run_model_shape(train_cfg, int(meta["true_vocab"])))
    tokenizer = load_from_config(train_cfg.tokenizer)
    # An older tinytrain's fingerprint of the same tokenizer names the same token ids.
    same = meta["tokenizer_fingerprint"] in (fingerprint(tokenizer), *earlier_fingerprints(tokenizer))
    if not same or len(tokenizer) != meta["true_vocab"]:
        raise ConfigError(
            Problem(
                KEY,
                str(path),
                f"was saved with tokenizer {meta['tokenizer_fingerprint']} ({meta['true_vocab']} tokens); {train_cfg.tokenizer.path} now loads as {fingerprint(tokenizer)} ({len(tokenizer)} tokens)",
                f"restore the run's tokenizer at {train_cfg.tokenizer.path} (the ids would mean other tokens)",
            )
        )
    return SavedRun(path, source_run, train_cfg, tokenizer, is_hf_folder=False, finetune=meta.get("finetune"))


def run_model_shape(train_cfg, vocab: int):
    """The model size a run's config describes (a pretrained base's from its config.json)."""
    if train_cfg.model.pretrained:
        return shape_from_hf(pretrained_config(train_cfg.model.pretrained, bool(train_cfg.model.trust_remote_code)), vocab)
    return shape_from_config(train_cfg.model, vocab)


def _hf_folder(path: Path) -> SavedRun:
    from transformers import AutoTokenizer

    train_cfg = run_config(path.parent / RUN_CONFIG) if (path.parent / RUN_CONFIG).is_file() else None
    return SavedRun(path, path.parent if train_cfg is not None else None, train_cfg, AutoTokenizer.from_pretrained(str(path), trust_remote_code=False), is_hf_folder=True)


def run_config(path: Path):
    """A run's config_resolved.yaml on the schema (enums typed, keys added since then defaulted,
    keys removed since then left out: on_schema), its relative paths taken from the folder the run
    ran in (run_paths)."""
    saved = OmegaConf.load(path)
    raise_if_any(interpolation_problems(saved, path))
    return run_paths(on_schema(saved, path), recorded_cwd(path.parent))


def interpolations(node, prefix: str = "") -> list[tuple[str, str]]:
    """(key, value) of every `${...}` in a loaded config, unresolved."""
    found = []
    items = node.items_ex(resolve=False) if OmegaConf.is_dict(node) else enumerate(node)
    for key, value in items:
        name = f"{prefix}.{key}" if OmegaConf.is_dict(node) else f"{prefix}[{key}]"
        name = name.lstrip(".")
        if OmegaConf.is_dict(value) or OmegaConf.is_list(value):
            found += interpolations(value, name)
        elif OmegaConf.is_interpolation(node, key):
            found.append((name, str(OmegaConf.to_container(node, resolve=False)[key])))
    return found


def interpolation_problems(saved, path: Path) -> list[Problem]:
    """tinytrain writes config_resolved.yaml resolved: a `${...}` in it was put there since (a run
    from elsewhere), and resolving it here would read this machine's environment into the outputs
    (`${oc.env:TOKEN}` as the data's name, printed and written to eval.json)."""
    return [
        Problem(key, value, f"{path} holds an interpolation, which tinytrain never writes there (it writes the file resolved)", "replace it in that file with the value the run trained with")
        for key, value in interpolations(saved)
    ]


def on_schema(saved, path: Path):
    """A run's config by an older tinytrain may hold keys this one no longer has (`logger.csv`):
    the merge refused them with a traceback in every mode that reads the run. They configure nothing
    here, so they are left out, and said."""
    from omegaconf.errors import ConfigKeyError

    dropped = []
    while True:
        try:
            merged = OmegaConf.merge(OmegaConf.structured(Config), saved)
        except ConfigKeyError as e:
            key = e.full_key
            parent, _, leaf = (key or "").rpartition(".")
            node = OmegaConf.select(saved, parent) if parent else saved
            if not key or key in dropped or not OmegaConf.is_dict(node) or leaf not in node:
                raise
            del node[leaf]
            dropped.append(key)
            continue
        if dropped:
            log.warning("%s: written by an older tinytrain, with keys this one no longer has, left out: %s", path, ", ".join(dropped))
        return merged


# Paths a run reads that a user types relative to where they run it (and data.sources[*].path).
PATH_KEYS = ("model.pretrained", "tokenizer.path", "data.path", "data.val_path", "data.store", "checkpoint.init_from")


def recorded_cwd(run: Path) -> Path | None:
    """The folder the run ran in, as Hydra recorded it (.hydra/hydra.yaml), if it did."""
    record = run / ".hydra" / "hydra.yaml"
    if not record.is_file():
        return None
    cwd = OmegaConf.select(OmegaConf.load(record), "hydra.runtime.cwd")
    return Path(cwd) if cwd else None


def run_paths(train_cfg, cwd: Path | None):
    """The files the run read, wherever this mode runs. A relative path means one in the folder the
    run ran in: an eval from elsewhere scored a file of the same name in its own folder (another
    corpus, silently), and an export looked for models/base under its own folder (then the hub). A
    file of the package's assets is read from the package as installed now (a run records the
    absolute path of the one that trained it; the tokenizer's fingerprint check still applies). A
    hub id (org/name) is no file in either folder and stays."""
    for key in PATH_KEYS:
        _resolve(train_cfg, key, cwd)
    for i in range(len(OmegaConf.select(train_cfg, "data.sources") or [])):
        _resolve(train_cfg, f"data.sources[{i}].path", cwd)
    return train_cfg


def _resolve(train_cfg, key: str, cwd: Path | None) -> None:
    value = OmegaConf.select(train_cfg, key)
    if not isinstance(value, str) or not value:
        return
    path = Path(value)
    if not path.is_absolute():
        if cwd is not None and ((cwd / path).exists() or path.exists()):
            # Gone from where the run read it but here by that name: another file (a moved or
            # copied run's eval scored it silently), so named where the run read it, as missing.
            OmegaConf.update(train_cfg, key, str(cwd / path))
        return
    if path.exists():
        return
    parts = path.parts
    starts = [i + 2 for i in range(len(parts) - 2) if parts[i : i + 2] == ASSET_FOLDER]  # tinytrain/assets/<file>
    if starts and ASSETS.joinpath(*parts[starts[-1] :]).exists():
        OmegaConf.update(train_cfg, key, str(ASSETS.joinpath(*parts[starts[-1] :])))


ASSET_FOLDER = ("tinytrain", "assets")  # ${tt.asset:<file>}, recorded resolved


def model_config(saved: SavedRun):
    """The transformers config the run trained (model/build.py's, the one training and the
    end-of-run export use; vocab rows set by the export to len(tokenizer))."""
    return build.model_config(saved.train_cfg.model, len(saved.tokenizer), saved.tokenizer)


def run_model(saved: SavedRun, dtype: str = "auto") -> RunModel:
    """What the export needs, from the run's saved config (its precision and template; `dtype`:
    export.dtype)."""
    return RunModel(model_config(saved), saved.tokenizer, len(saved.tokenizer), export_spec(saved.train_cfg, saved.tokenizer, dtype), saved.finetune)


def state_dict(saved: SavedRun) -> dict:
    """The HF model's weights from the checkpoint (a DeepSpeed folder consolidated first)."""
    return checkpoint_state_dict(saved.checkpoint)


def hf_model(saved: SavedRun, trust_remote_code: bool = False):
    """The model, ready for inference (eval mode, KV cache on), from either kind of source."""
    from transformers import AutoModelForCausalLM

    if saved.is_hf_folder:
        if trust_remote_code:
            announce("checkpoint.path", saved.checkpoint)
        model = AutoModelForCausalLM.from_pretrained(str(saved.checkpoint), trust_remote_code=trust_remote_code)
    else:
        state = state_dict(saved)
        if saved.finetune:
            state = merge_adapters(state, saved.finetune)
        model = model_from_state_dict(state, model_config(saved), len(saved.tokenizer))
    model.config.use_cache = True
    return model.eval()

"""Hugging Face export from a tinytrain checkpoint: exactly len(tokenizer) rows, and
config.vocab_size equal to it, whatever tp or strategy trained it; a folder that serves as the
model that was trained: the training chat template as the tokenizer's `chat_template`, generation
that stops at the turn end, the KV cache on, weights in the training precision, readable files."""

from __future__ import annotations

import contextlib
import copy
import logging
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tinytrain.checkpoint.disk_space import free_space, out_of_space
from tinytrain.checkpoint.export_target import export_dir_problems, interrupted_exports, model_files_missing
from tinytrain.checkpoint.files import publish_directory, temp_path, temp_writer_alive
from tinytrain.checkpoint.format import unpad_vocab, vocab_param_names
from tinytrain.checkpoint.formats import format_of
from tinytrain.config.dtype import Dtype
from tinytrain.errors import ConfigError, Problem, raise_if_any

log = logging.getLogger(__name__)



@dataclass(frozen=True)
class ExportSpec:
    """What makes the folder serve as the trained model (export_spec() derives it from a run's config)."""

    dtype: Dtype = Dtype.fp32
    chat_template: str | None = None  # Jinja
    turn_end: list[str] = field(default_factory=list)  # tokens generation stops at (EOS first)
    add_bos: bool = False


def export_dtype(requested: str, precision: Dtype) -> Dtype:
    """export.dtype: auto follows the training precision."""
    return precision if requested == "auto" else Dtype(requested)


def export_spec(train_cfg, tokenizer, requested_dtype: str = "auto", precision: Dtype | None = None, *, add_bos: bool | None = None) -> ExportSpec:
    """From the training run's config: its chat template when it fine-tuned, its precision and its
    BOS decision (a saved run's config_resolved.yaml holds them; a run in progress passes its plan's)."""
    from tinytrain.config.schema import ChatTemplate, DataFormat
    from tinytrain.data.chat_jinja import jinja_template, turn_end_tokens

    add_bos = bool(train_cfg.data.prepend_bos) if add_bos is None else add_bos
    template, ends = None, [tokenizer.eos_token]
    if DataFormat(train_cfg.data.format) != DataFormat.text:
        chat = ChatTemplate(train_cfg.data.chat_template)
        template = jinja_template(chat, getattr(tokenizer, "chat_template", None), add_bos)
        ends = turn_end_tokens(chat, tokenizer)
    precision = precision or Dtype.from_lightning(train_cfg.precision.value)
    return ExportSpec(export_dtype(requested_dtype, precision), template, ends, add_bos)


def export_state_dict(state_dict: dict, *, model_config, tokenizer, true_vocab: int, out_dir: Path, spec: ExportSpec | None = None, adapters: dict | None = None) -> Path:
    """`state_dict`: the HF model's full weights (padded or not). Saves model + tokenizer.
    `adapters` (a LoRA run's finetune plan): the folder holds the merged model, and `adapter/` peft's
    adapter for the base (lora_weights.py)."""
    spec = spec or ExportSpec()
    with export_folder(out_dir) as tmp:
        if adapters:
            from tinytrain.checkpoint.lora_weights import base_weights, merge_adapters, with_base, write_adapter_folder

            state_dict = with_base(state_dict, adapters)
            base = model_from_state_dict(base_weights(state_dict), model_config, true_vocab)
            write_adapter_folder(state_dict, adapters, base, tmp / "adapter", final_dir=out_dir / "adapter")
            state_dict = merge_adapters(state_dict, adapters)
        model = model_from_state_dict(state_dict, model_config, true_vocab)
        tokenizer = prepare_served(model, tokenizer, spec)
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        readable(tmp)
    log.info("exported Hugging Face model to %s (%d vocab rows, %s, stops at %s)", out_dir, true_vocab, spec.dtype.value, ", ".join(spec.turn_end or [tokenizer.eos_token]))
    return out_dir


def export_sharded(folder: Path, *, model_config, tokenizer, true_vocab: int, out_dir: Path, spec: ExportSpec | None = None) -> Path:
    """export_state_dict's folder for a sharded (fsdp_tp) checkpoint, its weights streamed from the
    shards one tensor at a time (stream_export.py): never the whole model in memory."""
    from tinytrain.checkpoint.stream_export import write_weights

    spec = spec or ExportSpec()
    with export_folder(out_dir) as tmp:
        model = meta_model(model_config, true_vocab)
        tokenizer = prepare_served(model, tokenizer, spec)
        save_config(model, tmp)
        write_weights(Path(folder), model, true_vocab, tmp)
        tokenizer.save_pretrained(str(tmp))
        readable(tmp)
    log.info("exported Hugging Face model to %s (%d vocab rows, %s, stops at %s; streamed from the shards)", out_dir, true_vocab, spec.dtype.value, ", ".join(spec.turn_end or [tokenizer.eos_token]))
    return out_dir


def prepare_served(model, tokenizer, spec: ExportSpec):
    """The model in the export dtype, its config and generation settings for serving; returns the
    tokenizer to save beside it."""
    model.to(spec.dtype.torch)
    # Training runs without the KV cache (packed documents); served generation needs it.
    model.config.use_cache = True
    tokenizer = served_tokenizer(tokenizer, spec)
    ends = [tokenizer.convert_tokens_to_ids(t) for t in spec.turn_end] or [tokenizer.eos_token_id]
    generation = model.generation_config
    generation.eos_token_id = ends  # list form: stop at any turn end
    generation.bos_token_id = tokenizer.bos_token_id
    generation.pad_token_id = tokenizer.pad_token_id
    generation.use_cache = True
    return tokenizer


def save_config(model, out_dir: Path) -> None:
    """What save_pretrained writes besides the weights (config.json with the dtype and architecture,
    generation_config.json, a custom model's code), for a model whose weights are written apart."""
    model.config.dtype = str(model.dtype).split(".")[1]
    model.config.architectures = [type(model).__name__]
    if getattr(model, "_auto_class", None) is not None:
        from transformers.dynamic_module_utils import custom_object_save

        custom_object_save(model, str(out_dir), config=model.config)
    model.config.save_pretrained(str(out_dir))
    if model.can_generate():
        model.generation_config.save_pretrained(str(out_dir))


def meta_model(model_config, true_vocab: int):
    """The HF model with `true_vocab` rows on the meta device (shapes and names, no weights)."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model_config)
    config.vocab_size = true_vocab
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config)


@contextlib.contextmanager
def export_folder(out_dir: Path):
    """Where an export is written: a temp sibling (`<dir>.tmp-<pid>`, as checkpoints), published
    onto `out_dir` only when every file is written, so a kill or a full disk leaves the previous
    export (or none) and never a config.json without weights. Temp folders of killed exports go first."""
    out_dir = Path(out_dir)
    # Checked in the plan too; here for every caller, since publishing replaces the whole folder.
    raise_if_any(export_dir_problems("export.dir", out_dir))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    for stale in interrupted_exports(out_dir):
        if temp_writer_alive(stale):  # another export into the same folder, still writing: both publish whole
            log.warning("left %s: another export into %s is writing it", stale.name, out_dir)
            continue
        log.warning("removed %s: an export that was interrupted", stale)
        shutil.rmtree(stale, ignore_errors=True)
    tmp = temp_path(out_dir)
    tmp.mkdir()
    try:
        yield tmp
        # e.g. its folder removed under it by a process that took it for a killed export's (the
        # tokenizer's files vary with its kind: what generate and eval need of it is checked there)
        missing = model_files_missing(tmp)
        if missing:
            raise ConfigError(Problem("export.dir", str(out_dir), f"the export written to {tmp.name} lacks {'; '.join(missing)}, so it was not published (what was at {out_dir.name} is unchanged)", "export again, with no other export into the same folder at the same time"))
        publish_directory(tmp, out_dir)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if out_of_space(e):
            raise ConfigError(export_disk_full(out_dir, tmp)) from e
        raise


def export_disk_full(out_dir: Path, tmp: Path) -> Problem:
    """A disk that filled up during the export: what is left, where, and what to do."""
    previous = "the previous export there is intact" if (out_dir / "config.json").is_file() else "nothing was published there"
    return Problem(
        "export.dir",
        str(out_dir),
        f"the disk filled up while the export was written ({tmp.name}, removed; {previous}): {free_space(out_dir.parent)} on the disk holding {out_dir.parent}",
        f"free space there (df -h {out_dir.parent}) or set export.dir to a folder on another disk, then export again (mode=export checkpoint=<run>/checkpoints/final.ckpt export.dir=<folder>)",
    )


def model_from_state_dict(state_dict: dict, model_config, true_vocab: int):
    """The HF model with `true_vocab` rows holding `state_dict`'s weights (no copy of the tensors)."""
    model = meta_model(model_config, true_vocab)
    names = vocab_param_names(model)
    unpad_vocab(state_dict, names, true_vocab)
    model.load_state_dict(state_dict, strict=True, assign=True)
    model.tie_weights()
    # Non-persistent buffers (RoPE frequencies) are in no state dict: built again off the meta device.
    for name, module in model.named_modules():
        if any(b.is_meta for b in module.buffers(recurse=False)) and hasattr(module, "config"):
            parent = model.get_submodule(name.rpartition(".")[0]) if "." in name else model
            setattr(parent, name.rpartition(".")[2], type(module)(module.config))
    return model


def served_tokenizer(tokenizer, spec: ExportSpec):
    """A copy with the chat template, the turn-end tokens registered as special tokens, and BOS
    added by the tokenizer itself when the run trained with it."""
    tok = copy.deepcopy(tokenizer)
    if spec.chat_template:
        tok.chat_template = spec.chat_template
    extra = [t for t in spec.turn_end if t not in tok.all_special_tokens]
    if extra:
        tok.add_special_tokens({"additional_special_tokens": extra})
    backend = getattr(tok, "backend_tokenizer", None)
    if spec.add_bos and backend is not None and tok.bos_token is not None:
        from tokenizers.processors import TemplateProcessing

        bos = (tok.bos_token, tok.bos_token_id)
        backend.post_processor = TemplateProcessing(single=f"{bos[0]}:0 $A:0", pair=f"{bos[0]}:0 $A:0 {bos[0]}:1 $B:1", special_tokens=[bos])
    return tok


def readable(out_dir: Path) -> None:
    """transformers writes model.safetensors through a private temp file (0600); an export is for
    others (a serving user, a shared model folder) to read."""
    out_dir.chmod(0o755)
    for entry in out_dir.rglob("*"):
        entry.chmod(0o755 if entry.is_dir() else 0o644)


def checkpoint_state_dict(ckpt_path: Path, keep_at: Path | None = None) -> dict:
    """The HF-model weights of a tinytrain checkpoint (Lightning's `model.` prefix removed), as its
    format reads them (formats.py): a sharded (fsdp_tp) folder one tensor at a time without the
    optimizer state, a DeepSpeed folder consolidated first (kept at `keep_at` when given)."""
    return format_of(ckpt_path).read_weights(Path(ckpt_path), "checkpoint.path", keep_at)  # what the user named it by


def export_checkpoint(ckpt_path: Path, *, model_config, tokenizer, true_vocab: int, out_dir: Path, spec: ExportSpec | None = None, adapters: dict | None = None, keep_at: Path | None = None) -> Path:
    """A format whose weights read one tensor at a time streams (export_sharded) unless LoRA
    adapters are to be merged (each merged weight needs its base and adapter tensors together: the
    whole-weights path). `keep_at`: where a DeepSpeed folder's consolidated file is kept."""
    if format_of(ckpt_path).streams_export and not adapters:
        return export_sharded(Path(ckpt_path), model_config=model_config, tokenizer=tokenizer, true_vocab=true_vocab, out_dir=out_dir, spec=spec)
    return export_state_dict(checkpoint_state_dict(ckpt_path, keep_at), model_config=model_config, tokenizer=tokenizer, true_vocab=true_vocab, out_dir=out_dir, spec=spec, adapters=adapters)

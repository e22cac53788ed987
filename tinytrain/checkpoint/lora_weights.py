"""A LoRA run's checkpoint weights -> a merged Hugging Face state dict and peft's adapter folder.

A LoRA checkpoint holds the whole model as trained (tinytrain/model/lora.py): the frozen base,
with each adapted projection's weight at `<proj>.base_layer.weight`, and the adapters at
`<proj>.lora_A.default.weight` / `<proj>.lora_B.default.weight`. Merging is W + (alpha / rank) B A,
which is what peft's merge computes; the adapter folder is written by peft itself, so
`PeftModel.from_pretrained(base, folder)` loads it. `finetune` is the plan's FinetunePlan as a dict
(saved in every checkpoint's `tinytrain` metadata).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)

LORA_A, LORA_B, BASE = ".lora_A.default.weight", ".lora_B.default.weight", ".base_layer."


def has_adapters(state_dict: dict) -> bool:
    return any(k.endswith(LORA_A) for k in state_dict)


def with_base(state_dict: dict, finetune: dict) -> dict:
    """A QLoRA checkpoint leaves its 4-bit projections out: they come back from the base folder in
    full precision (the adapters were trained against their NF4 rounding; merging into the original
    weights is what a QLoRA export does). Other checkpoints are returned as they are."""
    if finetune["method"] != "qlora":
        return state_dict
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(finetune["base"], dtype=torch.float32, trust_remote_code=False).state_dict()
    adapted = {k.removesuffix(LORA_A) for k in state_dict if k.endswith(LORA_A)}
    full = {}
    for key, value in base.items():
        module, _, leaf = key.rpartition(".")
        full[f"{module}{BASE}{leaf}" if module in adapted else key] = value
    full.update(state_dict)  # adapters, vocab tables (with the run's rows), norms
    return full


def base_weights(state_dict: dict) -> dict:
    """The base model's state dict: adapters dropped, `base_layer` names back to plain ones."""
    return {k.replace(BASE, "."): v for k, v in state_dict.items() if ".lora_" not in k}


def merge_adapters(state_dict: dict, finetune: dict) -> dict:
    """A plain Hugging Face state dict with every adapter merged into its projection."""
    state_dict = with_base(state_dict, finetune)
    merged = base_weights(state_dict)
    scaling = finetune["alpha"] / finetune["rank"]
    for key, a in state_dict.items():
        if not key.endswith(LORA_A):
            continue
        proj = key.removesuffix(LORA_A)
        b = state_dict[proj + LORA_B]
        w = merged[proj + ".weight"]
        merged[proj + ".weight"] = (w.float() + scaling * (b.float() @ a.float())).to(w.dtype)
    return merged


def portable_base(base: str, final_dir: Path | None) -> str:
    """The adapter's base_model_name_or_path: a hub id as given; a local folder relative to the
    adapter folder's final place (`final_dir`), so the config names no machine's absolute path and
    stays right when the run and its base move together. A base from checkpoint.init_from is a
    tinytrain checkpoint, which peft cannot load: its run's export where that holds the same weights
    (init_from=<run>/checkpoints/final.ckpt and <run>/hf_export), else the checkpoint, with a warning."""
    path = Path(base)
    if path.exists() and is_tinytrain_checkpoint(path):
        export = path.parent.parent / "hf_export"
        if path.name.startswith("final.") and (export / "config.json").is_file():
            path = export
        else:
            log.warning(
                "hf_export/adapter: its base, checkpoint.init_from=%s, is a tinytrain checkpoint peft cannot load: export it (mode=export checkpoint=%s) and pass that folder to PeftModel.from_pretrained as the base",
                base,
                base,
            )
    if final_dir is None or not path.exists():
        return base
    return Path(os.path.relpath(path.resolve(), Path(final_dir).resolve())).as_posix()


def is_tinytrain_checkpoint(path: Path) -> bool:
    """A checkpoint of a format the table knows other than a Hugging Face folder."""
    from tinytrain.checkpoint.formats import CheckpointFormat, format_of

    return format_of(path).format is not CheckpointFormat.hf_export


def write_adapter_folder(state_dict: dict, finetune: dict, base_model, out_dir: Path, final_dir: Path | None = None) -> Path:
    """peft's adapter folder (adapter_config.json, adapter_model.safetensors) for `base_model` (the
    base with len(tokenizer) rows, built from base_weights()), as peft writes it for a causal LM
    (task_type CAUSAL_LM); `final_dir`: where the folder ends up (`out_dir` is written and renamed
    there), which a local base's path is written relative to. The rows of trainable tokens go in as
    peft's trainable tokens (their trained values), so a base resized to len(tokenizer) gets them."""
    from peft import LoraConfig, TaskType, get_peft_model

    ids = list(finetune["trainable_token_ids"])
    tables = {"embed_tokens": base_model.get_input_embeddings()}
    if base_model.get_output_embeddings() is not None and base_model.get_output_embeddings().weight is not base_model.get_input_embeddings().weight:
        tables["lm_head"] = base_model.get_output_embeddings()
    config = LoraConfig(
        r=finetune["rank"],
        lora_alpha=finetune["alpha"],
        lora_dropout=finetune["dropout"],
        target_modules=list(finetune["target_modules"]),
        bias="none",
        trainable_token_indices={name: ids for name in tables} if ids else None,
        base_model_name_or_path=portable_base(finetune["base"], final_dir),
        task_type=TaskType.CAUSAL_LM,
    )
    trained_rows = {name: state_dict[_table_key(base_model, module)][ids] for name, module in tables.items()} if ids else {}
    base_model.name_or_path = config.base_model_name_or_path  # peft records the model's own name as the adapter's base
    peft_model = get_peft_model(base_model, config)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            ours = name.removeprefix("base_model.model.")
            if ".lora_" in name:
                p.copy_(state_dict[ours])
            elif "trainable_tokens_delta" in name:
                table = next(t for t in tables if f".{t}." in f".{ours}")
                p.copy_(trained_rows[table])
    out_dir.mkdir(parents=True, exist_ok=True)
    # With the trained rows as trainable tokens, peft need not copy whole embedding tables into the
    # folder (it would, seeing a resized vocab); without them the resized tables are the only record.
    peft_model.save_pretrained(str(out_dir), save_embedding_layers=False if ids else "auto")
    _note_vocab(out_dir, base_model.config.vocab_size)
    log.info("wrote the LoRA adapter (rank %d, %s%s) to %s", finetune["rank"], ", ".join(finetune["target_modules"]), f", {len(ids)} trained token rows" if ids else "", out_dir)
    return out_dir


def _table_key(model, module) -> str:
    return next(f"{n}.weight" for n, m in model.named_modules() if m is module)


def _note_vocab(out_dir: Path, rows: int) -> None:
    """Say in the folder what the base needs (peft's config has no field for it)."""
    (out_dir / "README.md").write_text(
        f"LoRA adapter written by tinytrain. Load it on the base model resized to the tokenizer in the parent folder ({rows} rows):\n\n"
        "    base = AutoModelForCausalLM.from_pretrained(BASE)\n"
        f"    base.resize_token_embeddings({rows})\n"
        "    model = PeftModel.from_pretrained(base, THIS_FOLDER)\n\n"
        "The parent folder holds the same model merged.\n"
    )

"""checkpoint.init_from: another run's weights, fitted to this run's tokenizer and padding."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import torch

from tinytrain.checkpoint.format import MODULE_PREFIX, read, repad_vocab, unpad_vocab
from tinytrain.checkpoint.resume import is_deepspeed_folder
from tinytrain.plan.start_points import InitPoint
from tinytrain.plan.vocab import VocabPlan

log = logging.getLogger(__name__)


def weights_for_run(init: InitPoint, names: list[str], vocab: VocabPlan, tokenizer) -> dict:
    """The init_from checkpoint's HF-model state dict (checked by the plan), resized to this
    run's tokenizer and re-padded for its tp."""
    path, meta = init.path, init.saved
    ckpt = read(path) if not is_deepspeed_folder(Path(path)) else consolidated(Path(path))
    state = {k.removeprefix(MODULE_PREFIX): v for k, v in ckpt["state_dict"].items() if k.startswith(MODULE_PREFIX)}
    if meta.get("finetune"):  # a LoRA run's checkpoint: its adapters merged into the base
        from tinytrain.checkpoint.lora_weights import merge_adapters

        state = merge_adapters(state, meta["finetune"])
    unpad_vocab(state, names, meta["true_vocab"])  # tolerate checkpoints saved padded
    old, new = meta["true_vocab"], vocab.true
    if new > old:
        added = tokenizer.convert_ids_to_tokens(list(range(old, new)))
        for name in names:
            w = state[name]
            state[name] = torch.cat([w, w.float().mean(0, keepdim=True).to(w.dtype).expand(new - old, -1)])
        log.warning("tokenizer changed: %d new rows mean-initialised in %s: %s", new - old, ", ".join(names), ", ".join(added))
    elif new < old:
        for name in names:
            state[name] = state[name][:new].clone()
        log.warning("tokenizer changed: dropped %d rows (ids %d..%d) from %s", old - new, new, old - 1, ", ".join(names))
    repad_vocab(state, names, vocab.padded)
    log.info("weights from %s (saved with tp %d, %d rows) -> %s", path, meta["tp"], meta["true_vocab"], vocab.describe())
    return state


def consolidated(folder: Path) -> dict:
    """A DeepSpeed step folder's weights as one checkpoint dict (Lightning's converter: the fp32
    master weights of every partition, under the module's keys), off its temp file."""
    from lightning.pytorch.utilities.deepspeed import convert_zero_checkpoint_to_fp32_state_dict

    log.info("consolidating the DeepSpeed checkpoint %s for its weights", folder)
    with tempfile.TemporaryDirectory(prefix="tinytrain-init-from-") as tmp:
        convert_zero_checkpoint_to_fp32_state_dict(str(folder), str(Path(tmp) / "consolidated.ckpt"))
        ckpt = read(str(Path(tmp) / "consolidated.ckpt"))
        return {**ckpt, "state_dict": {k: v.clone() for k, v in ckpt["state_dict"].items()}}

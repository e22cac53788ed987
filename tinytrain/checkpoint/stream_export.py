"""The weights of a sharded (fsdp_tp) checkpoint folder written as a Hugging Face export, one
tensor at a time: each weight is read whole from the shards of every rank (DCP's reader), its vocab
rows unpadded, cast to the export dtype and appended to its safetensors file, then dropped. Memory
holds one tensor (and DCP's read of its chunks), never the whole model; the optimizer state is
never read. For a 70B model that is the 2-3 GB of the largest table, not 140-280 GB.

The files are the ones `save_pretrained` writes for the same weights, to the byte: the same tensor
names (tied copies left out), shards of at most its default 50 GB with the same index, and within a
file safetensors' own order (dtype, then name) and header. Sizes and offsets are known from the
shapes alone, so each header is written before the first tensor of its file.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from tinytrain.checkpoint.format import unpad_rows, vocab_param_names
from tinytrain.checkpoint.sharded import MODEL_KEY, MODULE_PREFIX, read_index, read_weight

MAX_SHARD_SIZE = "50GB"  # save_pretrained's default
SAFE_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64", torch.int64: "I64", torch.int32: "I32", torch.uint8: "U8", torch.bool: "BOOL"}
# safetensors orders a file's tensors by its dtype enum, descending (then by name)
DTYPE_ORDER = ["BOOL", "U8", "I32", "F16", "BF16", "F32", "F64", "I64"]


def saved_tensors(model) -> dict[str, torch.Tensor]:
    """The tensors save_pretrained writes for `model` (a meta-device model: names, shapes, dtypes)."""
    from transformers.modeling_utils import remove_tied_weights_from_state_dict

    return remove_tied_weights_from_state_dict(model.state_dict(), model)


def write_weights(folder: Path, model, true_vocab: int, out_dir: Path, key: str = "checkpoint.path") -> list[Path]:
    """`model` (meta device, in the export dtype, `true_vocab` rows) says what to write; the values
    come from the sharded checkpoint `folder`. Returns the files written."""
    from huggingface_hub import split_torch_state_dict_into_shards

    index = read_index(folder, key)
    wanted = saved_tensors(model)
    vocab = set(vocab_param_names(model))
    split = split_torch_state_dict_into_shards(wanted, filename_pattern="model{suffix}.safetensors", max_shard_size=MAX_SHARD_SIZE)
    written = []
    for filename, names in split.filename_to_tensors.items():
        names = sorted(names, key=lambda n: (-DTYPE_ORDER.index(SAFE_DTYPES[wanted[n].dtype]), n))
        with (out_dir / filename).open("wb") as f:
            f.write(header({n: wanted[n] for n in names}))
            for name in names:
                target = wanted[name]
                tensor = read_weight(folder, MODEL_KEY + "." + MODULE_PREFIX + name, key, index)
                if name in vocab:
                    tensor = unpad_rows(tensor, true_vocab)
                tensor = tensor.to(target.dtype).contiguous()
                if tensor.shape != target.shape:
                    raise ValueError(f"{folder}: {name} has shape {tuple(tensor.shape)}, the exported model {tuple(target.shape)}")
                f.write(memoryview(tensor.view(torch.uint8).numpy()) if tensor.numel() else b"")
                del tensor
        written.append(out_dir / filename)
    if split.is_sharded:
        total = {"total_parameters": sum(t.numel() for t in model.parameters()), **split.metadata}
        text = json.dumps({"metadata": total, "weight_map": split.tensor_to_filename}, indent=2, sort_keys=True) + "\n"
        (out_dir / "model.safetensors.index.json").write_text(text, encoding="utf-8")
    return written


def header(tensors: dict[str, torch.Tensor]) -> bytes:
    """A safetensors header for `tensors` in this order, data back to back, as safetensors pads it."""
    entries, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, t in tensors.items():
        size = t.numel() * t.element_size()
        entries[name] = {"dtype": SAFE_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    text = json.dumps(entries, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text

"""Whether a folder's weight files are whole, read from their headers only (no tensor loaded):
a download or copy cut short, or an export killed while writing, leaves a safetensors file
shorter than its header says, which transformers reports only as a traceback deep in loading."""

from __future__ import annotations

import json
import struct
from pathlib import Path

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")
INDEX = "model.safetensors.index.json"
# Bytes per element of safetensors' dtypes (a tensor's offsets must hold its shape).
DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def safetensors_damage(path: Path) -> str | None:
    """Why a safetensors file cannot be whole (None when its size matches its header and each
    tensor's bytes hold its shape)."""
    if not path.is_file():  # a pipe would block the read forever, a folder cannot be read
        return "not a regular file"
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(8)
            if len(head) < 8:
                return f"{size} bytes, shorter than a safetensors header"
            (header_len,) = struct.unpack("<Q", head)
            if header_len > size - 8:
                return f"{size} bytes, cut short inside its header ({header_len} bytes announced)"
            header = json.loads(f.read(header_len))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        return f"unreadable header ({type(e).__name__}: {e})"
    if not isinstance(header, dict):
        return f"its header is a JSON {type(header).__name__}, not a table of tensors"
    end = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            start, stop = (int(x) for x in entry["data_offsets"])
            elements = 1
            for dim in entry["shape"]:
                elements *= int(dim)
            width = DTYPE_BYTES.get(entry["dtype"])
        except (TypeError, ValueError, KeyError):
            return f"tensor {name[:100]!r} has no readable dtype, shape and data_offsets in its header"
        if not 0 <= start <= stop or (width is not None and elements * width != stop - start):
            return f"tensor {name[:100]!r} is declared {entry['dtype']} {list(entry['shape'])} in bytes {start}..{stop}, which do not hold it"
        end = max(end, stop)
    if 8 + header_len + end != size:
        return f"{size} bytes where its header describes {8 + header_len + end}: cut short (an interrupted download, copy or export)"
    return None


def index_weight_map(index: Path) -> dict[str, str]:
    """model.safetensors.index.json's weight_map (tensor -> shard file). Raises ValueError unless it
    is a table of names to files of the folder: a `../` entry had the weights read from elsewhere."""
    data = json.loads(index.read_text())
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()):
        raise ValueError("its weight_map is not a table of tensor names to shard files")
    outside = sorted({v for v in weight_map.values() if Path(v).is_absolute() or ".." in Path(v).parts})
    if outside:
        raise ValueError(f"its weight_map names files outside the folder ({', '.join(outside[:3])})")
    return weight_map


def weight_problems(folder: Path) -> list[str]:
    """What is missing or damaged among a Hugging Face folder's weights ([] when whole)."""
    folder = Path(folder)
    index = folder / INDEX
    if index.is_file():
        try:
            shards = sorted(set(index_weight_map(index).values()))
        except (OSError, ValueError) as e:
            return [f"{index.name} unreadable ({e})"]
        missing = [s for s in shards if not (folder / s).is_file()]
        if missing:
            return [f"shard(s) {', '.join(missing)} named by {index.name} are missing"]
        files = [folder / s for s in shards]
    else:
        files = sorted(folder.glob("*.safetensors"))
        if not files and not any(folder.glob("pytorch_model*.bin")):
            return ["no weights (model.safetensors or pytorch_model.bin)"]
    return [f"{f.name}: {why}" for f in files if (why := safetensors_damage(f)) is not None]

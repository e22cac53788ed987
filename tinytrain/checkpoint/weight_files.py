"""Whether a folder's weight files are whole, read from their headers only (no tensor loaded):
a download or copy cut short, or an export killed while writing, leaves a safetensors file
shorter than its header says, which transformers reports only as a traceback deep in loading."""

from __future__ import annotations

import json
import struct
from pathlib import Path

WEIGHT_PATTERNS = ("*.safetensors", "pytorch_model*.bin")


def safetensors_damage(path: Path) -> str | None:
    """Why a safetensors file cannot be whole (None when its size matches its header)."""
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
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__" and isinstance(v, dict) and "data_offsets" in v), default=0)
    if 8 + header_len + end != size:
        return f"{size} bytes where its header describes {8 + header_len + end}: cut short (an interrupted download, copy or export)"
    return None


def weight_problems(folder: Path) -> list[str]:
    """What is missing or damaged among a Hugging Face folder's weights ([] when whole)."""
    folder = Path(folder)
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError) as e:
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

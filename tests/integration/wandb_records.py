"""Reads an offline wandb run file (run-*.wandb): its config and history records.

wandb 0.31 has no Python reader for its own record log (the writer is in Go), so this parses the
documented layout: a 7-byte ':W&B' header, then LevelDB-style 32 KiB blocks of records (4-byte
CRC, 2-byte length, 1-byte type: full, first, middle, last), each payload a wandb Record protobuf.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
HEADER = 7


def payloads(path: Path) -> list[bytes]:
    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a wandb run file"
    pos, out, pending = HEADER, [], b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if kind == 0 and length == 0:  # zero padding to the end of the block
            pos += left
            continue
        chunk = data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            pending = chunk
        elif kind == 3:
            pending += chunk
        elif kind == 4:
            out.append(pending + chunk)
    return out


def read_run(path: Path) -> tuple[dict, list[dict]]:
    """(config, history rows) of an offline run file."""
    from wandb.proto import wandb_internal_pb2

    config, history = {}, []
    for payload in payloads(path):
        rec = wandb_internal_pb2.Record()
        rec.ParseFromString(payload)
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            config.update({item.key: json.loads(item.value_json) for item in rec.run.config.update})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in rec.config.update})
        elif kind == "history":
            history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in rec.history.item})
    return config, history

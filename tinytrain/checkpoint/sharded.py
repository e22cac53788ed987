"""Sharded checkpoint folders (parallel=fsdp_tp), written with torch.distributed.checkpoint (DCP).

Every rank writes its own shards (`__<rank>_0.distcp`); rank 0 adds DCP's index (`.metadata`)
and the rest of the training state in `meta.pt` (Lightning's layout for a distributed checkpoint,
so Lightning's own loader reads these folders too). The folder is written under a temp name and
renamed by rank 0 once every rank's shards are on disk (files.py): a folder with a step name is
complete. Keys: `state_dict.<param>` (the LightningModule's, padded vocab rows as trained) and
`optimizer_0.state.<param>.<moment>`; each rank adds `tinytrain_save.rank<r>`, the save's id,
into its own shard file, so a shard copied in from another save is recognised.

Nothing here needs a process group: reading a folder (its state, one tensor, the consolidated
weights for an export) runs on a login node, one tensor at a time.
"""

from __future__ import annotations

import io
import pickle
import warnings
from pathlib import Path

import torch

from tinytrain.errors import ConfigError, Problem

META_FILE = "meta.pt"  # lightning.fabric.strategies.model_parallel._METADATA_FILENAME
INDEX_FILE = ".metadata"  # DCP's
MODEL_KEY = "state_dict"
SAVE_ID_KEY = "tinytrain_save"  # in meta.pt: {"id": hex, "ranks": world size}
MODULE_PREFIX = "model."  # Lightning's attribute for the HF model (format.MODULE_PREFIX)


def rank_id_key(rank: int) -> str:
    return f"{SAVE_ID_KEY}.rank{rank}"


def holds_shards(state_dict: dict) -> bool:
    """A state dict of DTensor shards (fsdp_tp's, saved sharded) rather than full tensors."""
    from torch.distributed.tensor import DTensor

    return any(isinstance(v, DTensor) for v in state_dict.values())


def id_tensor(save_id: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(bytes.fromhex(save_id)), dtype=torch.uint8)


class _IndexUnpickler(pickle.Unpickler):
    """DCP reads `.metadata` with pickle.load, which would run code from a file of elsewhere:
    tinytrain reads it first admitting only the classes DCP's index is made of."""

    # Modules whose own classes (dataclasses and enums of the index) may be named; nothing they import.
    CLASS_MODULES = ("torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.planner")
    NAMES = {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"), ("collections", "OrderedDict"), ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath")}

    def find_class(self, module, name):
        # A dotted name is looked up attribute by attribute from protocol 4 on
        # ("...filesystem", "os.system"): only plain names are read.
        if "." not in name:
            if (module, name) in self.NAMES:
                return super().find_class(module, name)
            if module in self.CLASS_MODULES:
                found = super().find_class(module, name)
                if isinstance(found, type) and found.__module__ == module:
                    return found
            if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)):
                return getattr(torch, name)
        raise pickle.UnpicklingError(f"unsupported GLOBAL {module}.{name}")


def read_index(folder: Path, key: str):
    """DCP's index of the folder (which tensors, their global shapes, which file holds each chunk)."""
    path = folder / INDEX_FILE
    if not path.is_file():
        raise ConfigError(Problem(key, str(folder), f"is a sharded checkpoint folder without DCP's index ({INDEX_FILE}): the save that wrote it did not finish", "resume from an earlier checkpoint (resume=auto skips this one), or delete the folder"))
    try:
        with path.open("rb") as f:
            return _IndexUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError) as e:
        raise ConfigError(Problem(key, str(path), f"refused: not a DCP index tinytrain writes ({' '.join(str(e).split())[:200]})", "use a checkpoint saved by tinytrain")) from None


def read_meta(folder: Path, key: str) -> dict:
    from tinytrain.checkpoint.safe_load import load_file

    path = folder / META_FILE
    if not path.is_file():
        raise ConfigError(Problem(key, str(folder), f"is a sharded checkpoint folder without {META_FILE} (step, loops, callbacks, tinytrain metadata): the save that wrote it did not finish", "resume from an earlier checkpoint (resume=auto skips this one), or delete the folder"))
    return load_file(path, key)


def shard_files(index) -> dict[str, int]:
    """Each shard file the index names -> the bytes it must hold at least."""
    needed: dict[str, int] = {}
    for info in index.storage_data.values():
        needed[info.relative_path] = max(needed.get(info.relative_path, 0), info.offset + info.length)
    return needed


def check_folder(folder: Path, key: str) -> dict:
    """The folder's meta.pt (global_step, callbacks, tinytrain metadata), after checking that
    every shard file the index names is there in full and was written by this save; raises
    ConfigError naming the file and the fix otherwise. Reads a few bytes per shard file."""
    meta = read_meta(folder, key)
    index = read_index(folder, key)
    earlier = "resume from an earlier checkpoint (resume=auto skips this one), or delete the folder"
    for name, size in sorted(shard_files(index).items()):
        if not isinstance(name, str) or Path(name).is_absolute() or ".." in Path(name).parts:
            # DCP's reader joins the name to the folder: it would read a file from elsewhere.
            raise ConfigError(Problem(key, str(folder), f"its index names the shard file {str(name)[:100]!r}, outside the folder", "use a checkpoint saved by tinytrain"))
        path = folder / name
        if not path.is_file():
            raise ConfigError(Problem(key, str(folder), f"is missing the shard file {name} (one rank's part of the weights and optimizer state)", earlier))
        if path.stat().st_size < size:
            raise ConfigError(Problem(key, str(folder), f"holds a truncated shard file {name} ({path.stat().st_size} bytes, the index needs {size})", earlier))
    saved = meta.get(SAVE_ID_KEY)
    if saved is None:
        return meta
    ids = read_tensors(folder, {rank_id_key(r): torch.empty(16, dtype=torch.uint8) for r in range(saved["ranks"])}, key, index)
    for r in range(saved["ranks"]):
        found = ids[rank_id_key(r)]
        if found is None:
            raise ConfigError(Problem(key, str(folder), f"has no shards of rank {r} (saved by {saved['ranks']} ranks)", earlier))
        if bytes(found.tolist()).hex() != saved["id"]:
            file = next((info.relative_path for idx, info in index.storage_data.items() if idx.fqn == rank_id_key(r)), "?")
            raise ConfigError(Problem(key, str(folder), f"{file} holds rank {r}'s shards of another save (save {bytes(found.tolist()).hex()[:8]}, this folder's {saved['id'][:8]}): a file copied in from another checkpoint", earlier))
    return meta


def read_tensors(folder: Path, wanted: dict[str, torch.Tensor], key: str, index=None) -> dict[str, torch.Tensor | None]:
    """Named tensors of the folder read into `wanted`'s buffers (full tensors, whatever ranks
    wrote them), without a process group; None for a name the folder does not hold."""
    import torch.distributed.checkpoint as dcp

    index = index or read_index(folder, key)
    present = {k: v for k, v in wanted.items() if k in index.state_dict_metadata}
    if present:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process": it is
            warnings.filterwarnings("ignore", message=r"torch.distributed is disabled")
            dcp.load(present, storage_reader=dcp.FileSystemReader(str(folder)), planner=SafeLoadPlanner(), no_dist=True)
    return {k: present.get(k) for k in wanted}


def tensor_shapes(folder: Path, key: str, prefix: str = MODEL_KEY + ".") -> dict[str, torch.Size]:
    """Global shapes of the folder's tensors under `prefix` (prefix removed), from the index alone."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    index = read_index(folder, key)
    return {k.removeprefix(prefix): v.size for k, v in index.state_dict_metadata.items() if k.startswith(prefix) and isinstance(v, TensorStorageMetadata)}


def shape_stand_ins(folder: Path, key: str) -> dict:
    """The HF model's state dict (`model.` prefix removed) as meta tensors of the saved shapes:
    what plan checks compare (format.saved_shape) without reading a byte of the weights."""
    shapes = tensor_shapes(folder, key, MODEL_KEY + "." + MODULE_PREFIX)
    return {k: torch.empty(size, device="meta") for k, size in shapes.items()}


def read_weight(folder: Path, name: str, key: str, index=None) -> torch.Tensor:
    """One tensor of the folder, whole (from every rank's chunks), by its flat name."""
    index = index or read_index(folder, key)
    md = index.state_dict_metadata.get(name)
    if md is None:
        raise ConfigError(Problem(key, str(folder), f"holds no tensor {name}", "use a checkpoint of this run's model"))
    return read_tensors(folder, {name: torch.empty(md.size, dtype=md.properties.dtype)}, key, index)[name]


def consolidated_weights(folder: Path, key: str) -> dict[str, torch.Tensor]:
    """The HF model's full weights (`model.` prefix removed, vocab rows padded as trained: init_from
    and generate unpad them), read one tensor at a time: never the optimizer state. All of them at
    once: the export streams instead (stream_export.py)."""
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    index = read_index(folder, key)
    prefix = MODEL_KEY + "." + MODULE_PREFIX
    names = [n for n, md in index.state_dict_metadata.items() if n.startswith(prefix) and isinstance(md, TensorStorageMetadata)]
    return {name.removeprefix(prefix): read_weight(folder, name, key, index) for name in names}


def SafeLoadPlanner():  # noqa: N802 (a class, built when first needed: DCP is imported lazily)
    """DCP's default load planner, except that the non-tensor items (the optimizer's param
    groups) are unpickled with weights_only=True: DCP's own loads them with weights_only=False."""
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class _SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            loaded = torch.load(value, weights_only=True)
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], loaded)
            else:
                self.state_dict[read_item.dest_index.fqn] = loaded

    return _SafeLoadPlanner()

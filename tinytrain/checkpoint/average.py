"""Checkpoint averaging: the mean weights of k checkpoints (as OLMo 2 and DeepSeek average the
last checkpoints of a run or of an anneal), written as a checkpoint; mode=average
(outputs/modes.py) and checkpoint.average_last at the end of training (train/fit.py) export it.

    python -m tinytrain mode=average checkpoints=[runs/x/checkpoints/step0000800.ckpt,runs/x/checkpoints/step0000900.ckpt]
    python -m tinytrain mode=average run.name=x checkpoint.average_last=3

Any checkpoint format a strategy saves: single / ddp `.ckpt` files (memory-mapped), fsdp_tp's
sharded DCP folders (read one tensor at a time) and DeepSpeed folders (consolidated one folder at
a time into a temp file by the caller's `consolidate`, Lightning's converter, so this module stays
Lightning-free; then memory-mapped). The mean is taken tensor by tensor: for each weight,
the k checkpoints' copies are read, summed in float64 and divided (k copies of one checkpoint give
back exactly its weights), so memory holds the result plus one tensor of each source, never k
models. Vocab rows are compared and averaged without the padding (each checkpoint's own
true_vocab rows), so checkpoints saved under another tp average together.

Refused before any weight is averaged, naming the checkpoint and the fix: checkpoints of another
tokenizer, model, shape (tensor names or sizes), or LoRA adapters (their mean is not the mean of
the merged weights).
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from tinytrain.checkpoint.files import fsync_directory, step_checkpoints, temp_path, temp_siblings, temp_writer_alive
from tinytrain.checkpoint.format import MODULE_PREFIX, module_weights, read
from tinytrain.errors import ConfigError, Problem

log = logging.getLogger(__name__)

KEY = "checkpoint.average"
VOCAB_TABLES = ("embed_tokens.weight", "lm_head.weight")


@dataclass
class Source:
    """One checkpoint's HF-model weights, readable one tensor at a time."""

    path: Path
    meta: dict  # its tinytrain metadata
    step: int
    shapes: dict[str, torch.Size]  # HF names (`model.` prefix removed), vocab tables unpadded
    read: object  # name -> the full tensor (unpadded vocab rows)


def file_source(path: Path, shown: Path | None = None) -> Source:
    """A .ckpt file (or a DeepSpeed folder's consolidated file): memory-mapped, read when touched."""
    from tinytrain.checkpoint.safe_load import load_file

    ckpt = load_file(path, KEY)
    meta = ckpt.get("tinytrain") or {}
    weights = module_weights(ckpt.get("state_dict", {}))
    true_vocab = meta.get("true_vocab")
    shapes = {k: unpadded_shape(k, v.shape, true_vocab) for k, v in weights.items()}
    return Source(shown or path, meta, int(ckpt.get("global_step", 0)), shapes, lambda name: unpad(name, weights[name], true_vocab))


def sharded_source(folder: Path) -> Source:
    """An fsdp_tp DCP folder: its index gives the shapes; each tensor is read when asked for."""
    from tinytrain.checkpoint.sharded import MODEL_KEY, check_folder, read_index, read_tensors, tensor_shapes

    meta_all = check_folder(folder, KEY)
    index = read_index(folder, KEY)
    prefix = MODEL_KEY + "." + MODULE_PREFIX
    meta = meta_all.get("tinytrain") or {}
    true_vocab = meta.get("true_vocab")
    sizes = tensor_shapes(folder, KEY, prefix)

    def read(name):
        md = index.state_dict_metadata[prefix + name]
        tensor = read_tensors(folder, {prefix + name: torch.empty(md.size, dtype=md.properties.dtype)}, KEY, index)[prefix + name]
        return unpad(name, tensor, true_vocab)

    return Source(folder, meta, int(meta_all.get("global_step", 0)), {k: unpadded_shape(k, s, true_vocab) for k, s in sizes.items()}, read)


def unpadded_shape(name: str, shape: torch.Size, true_vocab: int | None) -> torch.Size:
    if true_vocab is not None and name.endswith(VOCAB_TABLES) and shape[0] > true_vocab:
        return torch.Size([true_vocab, *shape[1:]])
    return torch.Size(shape)


def unpad(name: str, tensor: torch.Tensor, true_vocab: int | None) -> torch.Tensor:
    return tensor[:true_vocab] if true_vocab is not None and name.endswith(VOCAB_TABLES) else tensor


def open_sources(paths: list[Path], stack: contextlib.ExitStack, consolidate) -> list[Source]:
    """Each checkpoint as a Source, as its format reads (formats.py): a file memory-mapped, a
    format read one tensor at a time (fsdp_tp's shards) tensor by tensor, any other folder
    (DeepSpeed's) consolidated one at a time, by `consolidate(folder, file)`, into a temp file
    that `stack` removes."""
    from tinytrain.checkpoint.formats import CheckpointFormat, format_of

    sources = []
    for path in paths:
        row = format_of(path)
        if row.streams_export:
            sources.append(sharded_source(path))
        elif row.format is not CheckpointFormat.file:
            state = row.read_state(path, KEY)  # checked for pickled code before DeepSpeed loads the folder
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tinytrain-average-"))) / "consolidated.ckpt"
            log.info("consolidating the DeepSpeed checkpoint %s", path)
            consolidate(str(path), str(tmp))
            source = file_source(tmp, shown=path)
            source.meta, source.step = state.get("tinytrain") or {}, int(state.get("global_step", 0))
            sources.append(source)
        else:
            sources.append(file_source(path))
    return sources


def check_same_model(sources: list[Source]) -> None:
    """Every checkpoint against the first: tinytrain metadata, tokenizer, model, no adapters, shapes."""
    first = sources[0]
    fix = "average checkpoints of one run (or of runs of one model and tokenizer): checkpoints=[<run>/checkpoints/step...,...]"
    for s in sources:
        if not s.meta:
            raise ConfigError(Problem(KEY, str(s.path), "has no tinytrain metadata (true vocab, tokenizer fingerprint)", "use checkpoints saved by tinytrain"))
        if s.meta.get("finetune"):
            raise ConfigError(Problem(KEY, str(s.path), "holds LoRA adapters: the mean of adapters is not the mean of the merged weights", "export each checkpoint (mode=export), or average full fine-tunes"))
    for s in sources[1:]:
        if (s.meta["tokenizer_fingerprint"], s.meta["true_vocab"]) != (first.meta["tokenizer_fingerprint"], first.meta["true_vocab"]):
            raise ConfigError(
                Problem(KEY, str(s.path), f"was saved with tokenizer {s.meta['tokenizer_fingerprint']} ({s.meta['true_vocab']} tokens), {first.path} with {first.meta['tokenizer_fingerprint']} ({first.meta['true_vocab']} tokens): row i means another token in each", fix)
            )
        if s.meta["model"] != first.meta["model"]:
            raise ConfigError(Problem(KEY, str(s.path), f"is model={s.meta['model']}, {first.path} is model={first.meta['model']}", fix))
        if s.shapes != first.shapes:
            differ = sorted(set(s.shapes) ^ set(first.shapes)) or [k for k in first.shapes if s.shapes[k] != first.shapes[k]]
            name = differ[0]
            theirs, ours = s.shapes.get(name, "absent"), first.shapes.get(name, "absent")
            raise ConfigError(Problem(KEY, str(s.path), f"holds another model shape: {name} is {tuple(theirs) if theirs != 'absent' else theirs} there and {tuple(ours) if ours != 'absent' else ours} in {first.path} ({len(differ)} tensor(s) differ)", fix))


def mean_weights(sources: list[Source]) -> dict[str, torch.Tensor]:
    """The element-wise mean, one tensor at a time (float64 sums, each source's dtype kept)."""
    out = {}
    for name in sources[0].shapes:
        first = sources[0].read(name)
        total = first.to(torch.float64)
        for s in sources[1:]:
            total += s.read(name).to(torch.float64)
        out[name] = (total / len(sources)).to(first.dtype)
        del total
    return out


def newest_step_checkpoints(run_dir: Path, k: int) -> list[Path]:
    return sorted(p for _, p in step_checkpoints(run_dir / "checkpoints")[:k])


def resolve_paths(listed: list[str], last: int | None, run_dir: Path) -> list[Path]:
    """checkpoint.average (paths) or checkpoint.average_last (the newest k step checkpoints of the run)."""
    if listed and last:
        raise ConfigError(Problem("checkpoint.average_last", last, "and checkpoint.average both name the checkpoints to average", "give one: checkpoints=[...] or checkpoint.average_last=<k>"))
    if last is not None and last < 2:
        raise ConfigError(Problem("checkpoint.average_last", last, "averages the run's newest step checkpoints: at least 2", "use checkpoint.average_last=2 or more"))
    if last:
        found = [p for _, p in step_checkpoints(run_dir / "checkpoints")]
        if len(found) < last:
            raise ConfigError(Problem("checkpoint.average_last", last, f"{run_dir / 'checkpoints'} holds {len(found)} step checkpoint(s)", "average as many as there are, keep more (checkpoint.keep_last), or name the run (run.name=<run>)"))
        return writable_beside(newest_step_checkpoints(run_dir, last))
    if len(listed) < 2:
        raise ConfigError(Problem(KEY, list(listed), "needs two or more checkpoints to average", "checkpoints=[<run>/checkpoints/step0000800.ckpt,<run>/checkpoints/step0000900.ckpt], or checkpoint.average_last=<k> with run.name=<run>"))
    paths = [Path(p).absolute() for p in listed]  # `step4.ckpt` typed in checkpoints/: its parent is that folder, not `.`
    missing = [str(typed) for typed, p in zip(listed, paths) if not p.exists()]
    if missing:
        raise ConfigError(Problem(KEY, missing[0], "does not exist", "give checkpoint files or folders that exist"))
    return writable_beside(paths)


def writable_beside(paths: list[Path]) -> list[Path]:
    """`paths`, when the folder the mean is written to (beside the first: modes.average) is writable."""
    folder = paths[0].parent
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(Problem(KEY, str(paths[0]), f"the average is written beside it, and {folder} is not writable", "make that folder writable, or copy the checkpoints into one that is and average those"))
    return paths


def average_checkpoints(paths: list[Path], out: Path, consolidate) -> tuple[Path, dict]:
    """Writes the mean of `paths` to `out` (atomically: a temp file renamed onto it) as a checkpoint
    export, generate, eval and checkpoint.init_from read; returns it and its tinytrain metadata.
    `consolidate(folder, file)`: a DeepSpeed folder into one state-dict file."""
    with contextlib.ExitStack() as stack:
        sources = open_sources(paths, stack, consolidate)
        check_same_model(sources)
        weights = mean_weights(sources)
        meta = {**sources[0].meta, "averaged": [str(s.path) for s in sources]}
        step = max(s.step for s in sources)
    for stale in temp_siblings(out):  # a killed average's, model-sized
        if not temp_writer_alive(stale):
            log.warning("removed %s: an average that was interrupted", stale.name)
            stale.unlink(missing_ok=True)
    tmp = temp_path(out)
    try:
        torch.save({"state_dict": {MODULE_PREFIX + k: v for k, v in weights.items()}, "tinytrain": meta, "global_step": step}, tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    except BaseException as e:
        tmp.unlink(missing_ok=True)
        if isinstance(e, RuntimeError):  # torch.save's failure to open or write (not an OSError)
            raise ConfigError(Problem(KEY, str(out), f"could not be written: {e}", f"check that {out.parent} is writable and has room for the model's weights")) from e
        raise
    os.replace(tmp, out)
    fsync_directory(out.parent)
    return out, meta


def output_name(paths: list[Path]) -> str:
    """average-k<k>-<newest name>.ckpt, beside the checkpoints it averages."""
    newest = sorted(paths, key=lambda p: p.name)[-1].name.removesuffix(".ckpt")
    return f"average-k{len(paths)}-{newest}.ckpt"


def output_path(paths: list[Path], folder: Path) -> Path:
    """Where the mean of `paths` goes in `folder`: output_name, unless an average of other
    checkpoints holds that name (the run's own end-of-run average and a mode=average of other
    steps can share it): then the first free `-2`, `-3`, ... An average of the same checkpoints is
    replaced (it is the same weights)."""
    first = folder / output_name(paths)
    candidates = [first, *(first.with_name(f"{first.stem}-{n}.ckpt") for n in range(2, 1000))]
    for out in candidates:
        if not out.exists() or averaged_from(out) == sorted(p.resolve() for p in paths):
            if out != first:
                log.info("%s holds an average of other checkpoints: writing %s instead", first, out.name)
            return out
    raise ConfigError(Problem(KEY, str(first), "999 averages of other checkpoints already use this name", "remove old averages from the folder"))


def averaged_from(path: Path) -> list[Path] | None:
    """The checkpoints an average file was made from (its metadata), or None when unreadable."""
    try:
        meta = read(str(path), KEY).get("tinytrain") or {}
    except ConfigError:
        return None
    return sorted(Path(p).resolve() for p in meta.get("averaged", [])) or None

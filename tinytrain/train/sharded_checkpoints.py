"""fsdp_tp's checkpoints, sharded: Lightning's ModelParallelStrategy whose saves and loads go
through torch.distributed.checkpoint (tinytrain/checkpoint/sharded.py has the folder's layout).

Saving: each rank writes its own shards of the weights and optimizer state into one folder under
a temp name (no rank gathers anything); rank 0 writes meta.pt (step, loops, callbacks, tinytrain
metadata) and, once DCP's finish step has collected every rank's write results, renames the folder
onto its step name. With `checkpoint.async_save` the shards are staged (a copy in host memory) and
written by a background thread over a process group of their own while training goes on; the next
save, the end of training and a signal-triggered save wait for it first. The copy itself is made in
the background too (one stager for the run, its buffers reused from save to save), while the next
step's forward and backward run: that step's optimizer waits for the copy before it changes a
weight or a moment, so the checkpoint holds exactly the state at its step. A process killed while
writing leaves only the temp folder, which the next run removes (resume.leftover_temp_files).

Loading: a sharded folder loads into the sharded model and optimizer whatever the dp and tp it was
saved with (DCP reshards); a full .ckpt file (single, ddp, or an earlier tinytrain) is re-padded
and broadcast from rank 0.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import uuid
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from lightning.fabric.strategies.model_parallel import _load_raw_module_state
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.tensor import distribute_tensor

from tinytrain.checkpoint.disk_space import out_of_space
from tinytrain.checkpoint.files import fsync_directory, publish_directory, temp_path
from tinytrain.checkpoint.format import repad_rows
from tinytrain.checkpoint.formats import CheckpointFormat, format_of
from tinytrain.checkpoint.sharded import META_FILE, SAVE_ID_KEY, SafeLoadPlanner, check_folder, id_tensor, rank_id_key, tensor_shapes
from tinytrain.errors import TrainingStopped
from tinytrain.train.atomic_io import disk_full, disk_full_message

log = logging.getLogger(__name__)


class PendingSave:
    """An async save in flight. Rank 0 publishes the folder as soon as the write is done (from
    the writer's thread), so a complete checkpoint never waits for the next save to appear. A failed
    write is left in place for the strategy to settle on the training thread, with every rank."""

    def __init__(self, future, staged, tmp: Path, final: Path, publisher: bool):
        self.tmp, self.final, self.publisher = tmp, final, publisher
        self.staged = staged  # the copy into host memory: done before the next optimizer step
        self.error: BaseException | None = None
        self.disk_full = False  # measured as soon as the write failed, before any shard is removed
        self.settled = threading.Event()
        self.lock = threading.Lock()
        self.then: list = []  # run once published (pruning: older checkpoints go after the new one is in place)
        future.add_done_callback(self.done)

    def after_published(self, action) -> None:
        with self.lock:
            if not self.settled.is_set():
                self.then.append(action)
                return
        if self.error is None:
            action()

    def done(self, future) -> None:
        try:
            future.result()
            if self.publisher:
                publish_directory(self.tmp, self.final)
            with self.lock:
                actions, self.then = self.then, []
            for action in actions:
                action()
        except BaseException as e:  # told by the strategy's wait_for_checkpoint, on the training thread
            self.error, self.disk_full = e, is_disk_full(e, self.final)
        finally:
            with self.lock:
                self.settled.set()


def is_disk_full(error: BaseException, final: Path) -> bool:
    """Whether `error` is a full disk: in its chain, or told by the free space left (torch's zip
    writer may report it only as "unexpected pos"). Measure before any partial shard is removed."""
    return out_of_space(error) or (final.parent.exists() and disk_full(error, final.parent))


class ShardedModelParallelStrategy(ModelParallelStrategy):
    """The strategy of parallel=fsdp_tp: Lightning's ModelParallelStrategy whose saves and loads
    go through DCP, every rank its own shards (the module's docstring has how)."""

    def __init__(self, async_save: bool = False, **kwargs):
        super().__init__(save_distributed_checkpoint=True, **kwargs)
        self.async_save = async_save
        self.pending: PendingSave | None = None
        self.checkpoint_group = None  # async saves' collectives, apart from training's
        self.stager = None  # async saves' copies into host memory, on a thread of their own

    def save_checkpoint(self, checkpoint, filepath, storage_options=None):
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        self.wait_for_checkpoint()  # one save in flight at most, in order
        final = Path(self.broadcast(str(filepath)))
        tmp = Path(self.broadcast(str(temp_path(final))))  # rank 0's pid in every rank's name
        save_id = self.broadcast(uuid.uuid4().hex)
        state = {"state_dict": checkpoint.pop("state_dict")}
        state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
        state[rank_id_key(self.global_rank)] = id_tensor(save_id)
        checkpoint[SAVE_ID_KEY] = {"id": save_id, "ranks": self.world_size}
        try:
            folder_error = None
            if self.global_rank == 0:
                try:
                    tmp.mkdir(parents=True, exist_ok=True)
                    write_meta(checkpoint, tmp / META_FILE)
                except OSError as e:
                    folder_error = e
            # Collective: no rank enters DCP's collectives alone when rank 0 could not start the folder.
            if self.reduce_boolean_decision(folder_error is not None, all=False):
                raise folder_error or OSError(f"rank 0 could not write {tmp / META_FILE}")
            writer = dcp.FileSystemWriter(str(tmp))
            if self.async_save:
                response = dcp.async_save(state, storage_writer=writer, process_group=self.background_group(), async_stager=self.background_stager())
                self.pending = PendingSave(response.upload_completion, response.staging_completion, tmp, final, publisher=self.global_rank == 0)
                return
            dcp.save(state, storage_writer=writer)
        except (Exception, CheckpointException) as e:  # DCP's is a BaseException
            # Every rank is here (DCP raises on all of them, rank 0's folder error was shared above).
            self.settle_failed_save(e, is_disk_full(e, final), tmp, final)
        # DCP's finish step gathered every rank's write results before rank 0 wrote the index.
        if self.global_rank == 0:
            publish_directory(tmp, final)
        self.barrier("tinytrain.sharded_save_published")

    def settle_failed_save(self, error: BaseException, disk_full_here: bool, tmp: Path, final: Path):
        """Every rank agrees on what stopped the save before rank 0 removes the partial shards
        (a rank measuring the free space after that removal would see room and tell another story)."""
        full = self.reduce_boolean_decision(disk_full_here, all=False)
        if self.global_rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        if full:
            raise TrainingStopped(disk_full_message(final)) from error
        raise error

    def background_group(self):
        if self.checkpoint_group is None:
            self.checkpoint_group = dist.new_group(backend="gloo")
        return self.checkpoint_group

    def background_stager(self):
        """DCP's stager copying on a thread of its own (no pinned or shared memory: a CPU copy),
        kept for the run: each later save copies into the buffers of the first."""
        if self.stager is None:
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            self.stager = DefaultStager(StagingOptions(use_pinned_memory=False, use_shared_memory=False, use_async_staging=True, use_non_blocking_copy=False))
        return self.stager

    def optimizer_step(self, optimizer, closure, model=None, **kwargs):
        """The step's forward and backward overlap an async save's copy; the weights and
        moments change only once it is complete."""
        if self.pending is None or self.pending.staged.done():
            return super().optimizer_step(optimizer, closure, model, **kwargs)

        def then_wait_for_the_copy():
            result = closure()
            self.wait_for_staging()
            return result

        return super().optimizer_step(optimizer, then_wait_for_the_copy, model, **kwargs)

    def wait_for_staging(self) -> None:
        if self.pending is not None:
            self.pending.staged.exception()  # waits; a failed copy fails the upload too, told by wait_for_checkpoint

    def after_checkpoint_published(self, action) -> None:
        """Run `action` once the last save is in place: now, or from the writer's thread."""
        if self.pending is None:
            action()
        else:
            self.pending.after_published(action)

    def wait_for_checkpoint(self) -> None:
        """Block until the async save in flight (if any) is written and published."""
        pending, self.pending = self.pending, None
        if pending is None:
            return
        pending.settled.wait()
        if pending.error is not None:  # on every rank: DCP's async write raises on all of them
            self.settle_failed_save(pending.error, pending.disk_full, pending.tmp, pending.final)

    def teardown(self):
        # The end of training, an exception, or a signal's stop: the save in flight finishes first.
        try:
            self.wait_for_checkpoint()
        finally:
            if self.stager is not None:
                self.stager.close()
                self.stager = None
            super().teardown()

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        path = Path(self.broadcast(str(checkpoint_path)))
        if format_of(path).format is CheckpointFormat.sharded:
            return self.load_sharded(path)
        return self.load_full_file(path, weights_only)

    def load_sharded(self, path: Path) -> dict:
        meta = check_folder(path, "resume")
        state = {"state_dict": get_model_state_dict(self.model)}
        optimizers = {f"optimizer_{i}": opt for i, opt in enumerate(self.optimizers)}
        state.update({key: get_optimizer_state_dict(self.model, opt) for key, opt in optimizers.items()})
        # Vocab tables saved under another padding (another tp or vocab_multiple): not resharded
        # by DCP (their global shapes differ) but read whole, one at a time, re-padded and cut.
        shapes = tensor_shapes(path, "resume", "")
        repadded = []
        for name in self.lightning_module.vocab_names:
            holders = [(state["state_dict"], name, f"state_dict.{name}")]
            for key in optimizers:
                moments = state[key]["state"].get(name, {})
                holders += [(moments, m, f"{key}.state.{name}.{m}") for m, v in moments.items() if v.ndim >= 1]
            for holder, k, flat in holders:
                if flat in shapes and tuple(shapes[flat]) != tuple(holder[k].shape):
                    repadded.append((holder, k, flat, holder.pop(k)))
        dcp.load(state, storage_reader=dcp.FileSystemReader(str(path)), planner=SafeLoadPlanner())
        true_vocab = meta["tinytrain"]["true_vocab"]
        for holder, k, flat, target in repadded:
            saved = torch.empty(shapes[flat], dtype=target.dtype)
            dcp.load({flat: saved}, storage_reader=dcp.FileSystemReader(str(path)), planner=SafeLoadPlanner())
            full = repad_rows(saved, true_vocab, target.shape[0])
            target.to_local().copy_(distribute_tensor(full, target.device_mesh, target.placements).to_local())
            holder[k] = target
        set_model_state_dict(self.model, state["state_dict"], options=StateDictOptions(strict=self.lightning_module.strict_loading))
        for key, opt in optimizers.items():
            set_optimizer_state_dict(self.model, opt, optim_state_dict=state[key])
        meta.pop(SAVE_ID_KEY, None)
        return meta

    def load_full_file(self, path: Path, weights_only) -> dict:
        """A full checkpoint file (single, ddp; fsdp_tp before it saved sharded): the same steps
        as Lightning's loader for one, with the vocab rows of the weights and the Adam moments
        re-padded for this run's tp in between (module.on_load_checkpoint runs too late here)."""
        module = self.lightning_module
        checkpoint = torch.load(path, mmap=True, map_location="cpu", weights_only=weights_only)
        state = checkpoint.pop("state_dict")
        module.repad_state_dict(state)
        _load_raw_module_state(state, self.model, strict=module.strict_loading)
        options = StateDictOptions(broadcast_from_rank0=True, full_state_dict=True, strict=module.strict_loading)
        for optimizer, saved in zip(self.optimizers, checkpoint["optimizer_states"]):
            # By name, in the optimizer's own order (Lightning's rekeying assumes the module's
            # parameter order: a single/ddp file's state then lands on the wrong parameters), the
            # vocab moments re-padded for this run's tp.
            named = module.named_optimizer_state(saved) if isinstance(next(iter(saved["state"]), ""), int) else saved
            set_optimizer_state_dict(self.model, optimizer, optim_state_dict=named, options=options)
        return checkpoint


def write_meta(checkpoint: dict, path: Path) -> None:
    with open(path, "wb") as f:
        torch.save(checkpoint, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_directory(path.parent)

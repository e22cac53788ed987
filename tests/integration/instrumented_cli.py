"""`python -m tinytrain` with instruments for the tests that run it (test_resume.py, test_yi_like.py).

Usage: python -m tests.integration.instrumented_cli <tinytrain overrides...>
Environment:
  TT_TEST_BATCH_LOG=<file>  append a line per training batch: the step it trains and a digest of
                            its input ids (which samples a run saw, in order)
  TT_TEST_STALL_SAVE=<n>    the n-th checkpoint save of this process writes half its bytes and
                            then hangs, as on a slow disk, until the test kills the process
  TT_TEST_SLOW_SHARDED_SAVE=<n>:<s>  the n-th sharded (fsdp_tp) save of this process writes its
                            shard files and then waits <s> seconds before DCP's finish step (the
                            index, the rename): a slow disk, in the writer's thread under async_save
  TT_TEST_SLOW_STAGING=<s>   every async save's copy into host memory (DCP's stager, on its own
                            thread) starts <s> seconds late: the next optimizer step must wait for it
  TT_TEST_NO_LOSS_SCALE_GUARD=1  the loss-scale guard watches but never stops the run (what
                            happens without it)
  TT_TEST_STALL_RANK=<rank>:<step>:<s>[:busy]  rank <rank> stops for <s> seconds at the start of
                            training step <step> (once): asleep, or with `busy` spinning in a Python
                            loop (a rank stuck in its own code while the others wait in a collective);
                            in a requeued Slurm job's later starts (SLURM_RESTART_COUNT > 0) not at all
  TT_TEST_SLOW_RANK=<rank>:<factor>  rank <rank>'s every training step takes <factor> times as long
                            (before each forward it spins for (factor - 1) x the last one's CPU time): a
                            straggler, as a slower core would make it; the health check's matmul too
  TT_TEST_SLOW_SAVE=<s>     every checkpoint file this process writes waits <s> seconds first (a
                            slow disk: a save longer than the hang watchdog's step limit)
  TT_TEST_EAGER_DEEPSPEED_MUON=1  DeepSpeed's Newton-Schulz functions run as written, not under
                            the torch.compile it wraps them in (on a CPU: inductor's C++ for each
                            matrix shape, ~5 s per rank per run; test_recipes.py's runs agree to 1e-6 either way)
  TT_TEST_KILL_AT=<point>:<step>  SIGKILL this process during the save of step <step>'s checkpoint:
                            before_rename (the temp file written, not renamed), after_rename (in
                            place, older ones not yet pruned) or after_prune (the save complete)
"""

import hashlib
import os
import sys
import time


def record_batches(path: str) -> None:
    from tinytrain.model.module import CausalLMModule

    train = CausalLMModule.training_step

    def training_step(self, batch, batch_idx):
        digest = hashlib.sha1(batch["input_ids"].numpy().tobytes()).hexdigest()[:16]
        with open(path, "a") as f:
            f.write(f"{self.trainer.global_step + 1} {digest}\n")
        return train(self, batch, batch_idx)

    CausalLMModule.training_step = training_step


def stall_save(n: int) -> None:
    import io

    import torch

    from tinytrain.train.atomic_io import AtomicCheckpointIO

    saves = []

    def write(self, checkpoint, f):
        saves.append(1)
        if len(saves) < n:
            return torch.save(checkpoint, f)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        f.write(buffer.getvalue()[: buffer.tell() // 2])
        f.flush()
        time.sleep(600)

    AtomicCheckpointIO.write = write


def kill_during_save(point: str, step: int) -> None:
    import signal

    from tinytrain.checkpoint.files import step_checkpoint_name
    from tinytrain.train.atomic_io import AtomicCheckpointIO
    from tinytrain.train.callbacks import step_checkpoints

    name = step_checkpoint_name(step)
    die = lambda: os.kill(os.getpid(), signal.SIGKILL)  # noqa: E731
    write, prune = AtomicCheckpointIO.write, step_checkpoints.prune

    def write_then_die(self, checkpoint, f):
        write(self, checkpoint, f)
        if point == "before_rename" and os.path.basename(f.name).startswith(name):
            f.flush()
            die()

    def prune_around(directory, keep_last):
        saved = (directory / name).exists()
        if saved and point == "after_rename":
            die()
        removed = prune(directory, keep_last)
        if saved and point == "after_prune":
            die()
        return removed

    AtomicCheckpointIO.write = write_then_die
    step_checkpoints.prune = prune_around


def slow_sharded_save(n: int, seconds: float) -> None:
    from torch.distributed.checkpoint import FileSystemWriter

    write = FileSystemWriter.write_data
    saves = []

    def write_then_wait(self, plan, planner):
        written = write(self, plan, planner)
        saves.append(1)
        if len(saves) == n:
            written.wait()
            time.sleep(seconds)
        return written

    FileSystemWriter.write_data = write_then_wait


def slow_staging(seconds: float) -> None:
    from torch.distributed.checkpoint.staging import DefaultStager

    stage = DefaultStager._stage

    def wait_then_stage(self, state_dict, **kwargs):
        time.sleep(seconds)
        return stage(self, state_dict, **kwargs)

    DefaultStager._stage = wait_then_stage


def stall_rank(rank: int, step: int, seconds: float, busy: bool) -> None:
    from tinytrain.cluster.rank_logging import process_rank
    from tinytrain.model.module import CausalLMModule

    if process_rank() != rank:
        return
    train = CausalLMModule.training_step
    stalled = []

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step + 1 == step and not stalled:
            stalled.append(1)
            until = time.monotonic() + seconds
            while busy and time.monotonic() < until:
                pass
            time.sleep(max(0.0, until - time.monotonic()))
        return train(self, batch, batch_idx)

    CausalLMModule.training_step = training_step


def slow_rank(rank: int, factor: float) -> None:
    from tinytrain.cluster.rank_logging import process_rank
    from tinytrain.model.module import CausalLMModule

    if process_rank() != rank:
        return
    # The spin runs in the module's own batch hooks, beside the forward rather than around it: a
    # wrapper or a hook on the model puts frames under every call of the forward, which can move a
    # hot call onto an edge of CPython 3.11's frame-stack chunks (an mmap and munmap per call). That
    # alone made a 1.05x rank 12-25% slower. Lightning calls the module's hooks after the callbacks',
    # so the spin before a forward falls inside the straggler window and the last forward's CPU time
    # is read after the window ends.
    last_forward = [0.0, 0.0]  # the CPU time of the last forward, and when this one started

    def on_train_batch_start(self, batch, batch_idx):
        until = time.thread_time() + (factor - 1) * last_forward[0]
        while time.thread_time() < until:
            pass
        last_forward[1] = time.thread_time()

    def on_before_backward(self, loss):
        last_forward[0] = time.thread_time() - last_forward[1]

    CausalLMModule.on_train_batch_start = on_train_batch_start
    CausalLMModule.on_before_backward = on_before_backward
    # and the health check's matmul (mode=health, cluster.health_check), the same way
    from tinytrain.cluster import health

    matmul = health.one_matmul

    def slow_matmul(a, b):
        started = time.thread_time()
        out = matmul(a, b)
        until = time.thread_time() + (factor - 1) * (time.thread_time() - started)
        while time.thread_time() < until:
            pass
        return out

    health.one_matmul = slow_matmul


def slow_save(seconds: float) -> None:
    from tinytrain.train.atomic_io import AtomicCheckpointIO

    write = AtomicCheckpointIO.write

    def wait_then_write(self, checkpoint, f):
        time.sleep(seconds)
        return write(self, checkpoint, f)

    AtomicCheckpointIO.write = wait_then_write


def eager_deepspeed_muon() -> None:
    from deepspeed.runtime.zero.muon import muon_optimizer, original_muon

    for module in (original_muon, muon_optimizer):  # muon_optimizer holds its own name for muon_update
        for name in ("zeropower_via_newtonschulz5", "zeropower_via_gram_newtonschulz", "muon_update"):
            compiled = getattr(module, name, None)
            if compiled is not None:
                setattr(module, name, compiled._torchdynamo_orig_callable)  # fails loudly if DeepSpeed stops compiling it


def disarm_loss_scale_guard() -> None:
    from tinytrain.train.callbacks.loss_scale_guard import LossScaleGuard

    LossScaleGuard.stop = lambda self, message: None


if __name__ == "__main__":
    if os.environ.get("TT_TEST_BATCH_LOG"):
        record_batches(os.environ["TT_TEST_BATCH_LOG"])
    if os.environ.get("TT_TEST_STALL_SAVE"):
        stall_save(int(os.environ["TT_TEST_STALL_SAVE"]))
    if os.environ.get("TT_TEST_KILL_AT"):
        point, step = os.environ["TT_TEST_KILL_AT"].split(":")
        kill_during_save(point, int(step))
    if os.environ.get("TT_TEST_SLOW_SHARDED_SAVE"):
        n, seconds = os.environ["TT_TEST_SLOW_SHARDED_SAVE"].split(":")
        slow_sharded_save(int(n), float(seconds))
    if os.environ.get("TT_TEST_SLOW_STAGING"):
        slow_staging(float(os.environ["TT_TEST_SLOW_STAGING"]))
    if os.environ.get("TT_TEST_STALL_RANK") and os.environ.get("SLURM_RESTART_COUNT", "0") == "0":
        rank, step, seconds, *busy = os.environ["TT_TEST_STALL_RANK"].split(":")
        stall_rank(int(rank), int(step), float(seconds), busy == ["busy"])
    if os.environ.get("TT_TEST_SLOW_RANK"):
        rank, factor = os.environ["TT_TEST_SLOW_RANK"].split(":")
        slow_rank(int(rank), float(factor))
    if os.environ.get("TT_TEST_SLOW_SAVE"):
        slow_save(float(os.environ["TT_TEST_SLOW_SAVE"]))
    if os.environ.get("TT_TEST_NO_LOSS_SCALE_GUARD"):
        disarm_loss_scale_guard()
    if os.environ.get("TT_TEST_EAGER_DEEPSPEED_MUON"):
        eager_deepspeed_muon()
    from tinytrain.cli import main

    sys.argv = ["tinytrain", *sys.argv[1:]]
    main()

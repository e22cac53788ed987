"""`python -m tinytrain` with instruments for the tests that run it (test_resume.py, test_yi_like.py).

Usage: python -m tests.integration.instrumented_cli <tinytrain overrides...>
Environment:
  TT_TEST_BATCH_LOG=<file>  append a line per training batch: the step it trains and a digest of
                            its input ids (which samples a run saw, in order)
  TT_TEST_STALL_SAVE=<n>    the n-th checkpoint save of this process writes half its bytes and
                            then hangs, as on a slow disk, until the test kills the process
  TT_TEST_NO_LOSS_SCALE_GUARD=1  the loss-scale guard watches but never stops the run (what
                            happens without it)
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


def disarm_loss_scale_guard() -> None:
    from tinytrain.train.callbacks.loss_scale_guard import LossScaleGuard

    LossScaleGuard.stop = lambda self, message: None


if __name__ == "__main__":
    if os.environ.get("TT_TEST_BATCH_LOG"):
        record_batches(os.environ["TT_TEST_BATCH_LOG"])
    if os.environ.get("TT_TEST_STALL_SAVE"):
        stall_save(int(os.environ["TT_TEST_STALL_SAVE"]))
    if os.environ.get("TT_TEST_NO_LOSS_SCALE_GUARD"):
        disarm_loss_scale_guard()
    from tinytrain.cli import main

    sys.argv = ["tinytrain", *sys.argv[1:]]
    main()

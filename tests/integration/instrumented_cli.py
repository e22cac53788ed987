"""`python -m tinytrain` with two instruments, for tests/integration/test_resume.py.

Usage: python -m tests.integration.resume_driver <tinytrain overrides...>
Environment:
  TT_TEST_BATCH_LOG=<file>  append a line per training batch: the step it trains and a digest of
                            its input ids (which samples a run saw, in order)
  TT_TEST_STALL_SAVE=<n>    the n-th checkpoint save of this process writes half its bytes and
                            then hangs, as on a slow disk, until the test kills the process
"""

import hashlib
import os
import sys
import time


def record_batches(path: str) -> None:
    from tinytrain.module import CausalLMModule

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

    from tinytrain.checkpoint_io import AtomicCheckpointIO

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


if __name__ == "__main__":
    if os.environ.get("TT_TEST_BATCH_LOG"):
        record_batches(os.environ["TT_TEST_BATCH_LOG"])
    if os.environ.get("TT_TEST_STALL_SAVE"):
        stall_save(int(os.environ["TT_TEST_STALL_SAVE"]))
    from tinytrain.cli import main

    sys.argv = ["tinytrain", *sys.argv[1:]]
    main()

"""What a training step leaves allocated into the next: the gradients are freed with their optimizer
step. Lightning zeroes them inside the next step's closure, after its forward, so they would sit
beside that forward's activations (4 B a parameter at its end; on an H100, TinyLlama-1.1B's
tinytrain step peaked 3.4 GiB above the raw loop's: benchmarks/README.md).
`python benchmarks/step_peak.py` measures the peak either way."""

import lightning.pytorch as pl
import pytest

from tests.integration.test_guards import train

pytestmark = pytest.mark.slow


class GradientsAtBatchStart(pl.Callback):
    """For each micro batch: whether any parameter holds a gradient as its forward begins."""

    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append(any(p.grad is not None for p in pl_module.parameters()))


@pytest.mark.parametrize("accumulate", [1, 2])
def test_gradients_do_not_outlive_their_optimizer_step(tmp_path, accumulate):
    """With accumulation the window's later micro batches add to the gradients of the earlier
    ones (held); the first micro batch of every window starts with none."""
    seen = GradientsAtBatchStart()
    module, trainer = train([f"trainer.global_batch_size={2 * accumulate}"], tmp_path, steps=3, callbacks=[seen])
    assert trainer.accumulate_grad_batches == accumulate
    assert seen.seen == [i % accumulate != 0 for i in range(3 * accumulate)]
    assert all(p.grad is None for p in module.parameters())

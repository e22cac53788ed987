"""What a training step leaves allocated into the next: the gradients are freed with their optimizer
step. Lightning zeroes them inside the next step's closure, after its forward, so they would sit
beside that forward's activations (4 B a parameter at its end; on an H100, TinyLlama-1.1B's
tinytrain step peaked 3.4 GiB above the raw loop's: benchmarks/README.md).
`python benchmarks/step_peak.py` measures the peak either way."""

import lightning.pytorch as pl
import pytest

from tests.integration.test_guards import small_with, train

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


def test_a_step_peaks_within_what_the_plan_counts(tmp_path):
    """A whole bf16-mixed step on this CPU (forward, loss, backward, clip, AdamW) adds to the weights
    and AdamW's state at most what the plan counts for activations and gradients, and not far less
    (0.87 here; benchmarks/step_peak.py: 0.58-0.90 at 5M-150M parameters; the plan counts every
    gradient at the peak, where a single process's peak holds few)."""
    from benchmarks.allocator_count import has_mallinfo2, step_peak_callback
    from tests.conftest import plan

    if not has_mallinfo2():
        pytest.skip("glibc before 2.33 has no mallinfo2")
    run = ["model.num_layers=2", "model.hidden_size=128", "model.num_heads=2", "model.num_kv_heads=2", "model.intermediate_size=352", "data.seq_len=128", "trainer.micro_batch_size=4", "precision=bf16"]
    reading = step_peak_callback()
    train(run, tmp_path / "run", steps=3, callbacks=[reading])
    memory = plan(small_with(run), tmp_path / "plan")["memory_per_gpu"]
    counted = (memory["activations_gib"] + memory["grads_gib"]) * 2**30
    measured = max(reading.peaks[1:])  # after the first step, which builds AdamW's state
    assert 0.6 * counted < measured <= counted, (measured, counted)

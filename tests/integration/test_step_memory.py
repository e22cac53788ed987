"""What a training step leaves allocated into the next: the gradients are freed with their optimizer
step. Lightning zeroes them inside the next step's closure, after its forward, so they would sit
beside that forward's activations (4 B a parameter at its end; on an H100, TinyLlama-1.1B's
tinytrain step peaked 3.4 GiB above the raw loop's: benchmarks/README.md).
`python benchmarks/step_peak.py` measures the peak either way. And a whole step's peak against the
plan's total (plan/step_peak.py), for one process and for two fsdp_tp ranks."""

import json

import lightning.pytorch as pl
import pytest

from tests.conftest import plan, run_ranks
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


def above_states(memory: dict) -> float:
    """The plan's total less the weights and the optimizer's state: what a step adds at its peak."""
    return (memory["total_gib"] - memory["params_gib"] - memory["optimizer_gib"] - memory["reference_gib"]) * 2**30


RUN = ["model.num_layers=2", "model.hidden_size=128", "model.num_heads=2", "model.num_kv_heads=2", "model.intermediate_size=352", "data.seq_len=128", "trainer.micro_batch_size=4", "precision=bf16"]


def test_a_step_peaks_within_what_the_plan_counts(tmp_path):
    """A whole bf16-mixed step on this CPU (forward, loss, backward, clip, AdamW) adds to the weights
    and AdamW's state the plan's total less them, within the activation count's own precision (0.997
    here; benchmarks/step_peak.py: 0.98-1.01 at 5M-150M parameters): the gradients are freed with
    each step, so it peaks in the backward over the activations alone, or in the optimizer step over
    the gradients (the plain sum, activations + gradients, was 0.87)."""
    from benchmarks.allocator_count import has_mallinfo2, step_peak_callback

    if not has_mallinfo2():
        pytest.skip("glibc before 2.33 has no mallinfo2")
    reading = step_peak_callback()
    train(RUN, tmp_path / "run", steps=3, callbacks=[reading])
    memory = plan(small_with(RUN), tmp_path / "plan")["memory_per_gpu"]
    assert not memory["step"]["grads_held"]
    measured = max(reading.peaks[1:])  # after the first step, which builds AdamW's state
    assert 0.9 * above_states(memory) < measured <= 1.02 * above_states(memory), (measured, memory)


@pytest.mark.parametrize("checkpointing", ["none", "full"])
def test_an_fsdp_rank_s_step_peaks_within_what_the_plan_counts(tmp_path, checkpointing):
    """Two fsdp_tp ranks (dp 2): FSDP2 gathers each block's weights, and the root's for the whole
    forward and backward, beside the activations; AdamW's per-tensor loop on a CPU. Measured 0.88
    (none) and 0.85 (full) of the count; the count before plan/step_peak.py (activations + gradients,
    nothing gathered) was 1.02x under both, and most under where the activations are small (the
    worker at 40M parameters, full checkpointing: 1.51x; benchmarks/README.md)."""
    from benchmarks.allocator_count import has_mallinfo2

    if not has_mallinfo2():
        pytest.skip("glibc before 2.33 has no mallinfo2")
    run = [*RUN, "parallel=fsdp_tp", "parallel.tp=1", "cluster.devices=2", f"trainer.activation_checkpointing={checkpointing}"]
    run_ranks("tests.integration.step_peak_worker", [str(tmp_path), *run], 2, env={"MALLOC_ARENA_MAX": "1", "OMP_NUM_THREADS": "1"}, local_rank=True)
    measured = max(json.loads((tmp_path / "step_peak.json").read_text())["peaks"][1:])
    memory = plan(small_with(run), tmp_path / "plan")["memory_per_gpu"]
    assert 0.7 * above_states(memory) < measured <= above_states(memory), (measured, memory)
    if checkpointing == "full":
        assert measured > (memory["activations_gib"] + memory["grads_gib"]) * 2**30, (measured, memory)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_s_reduce_buckets_are_what_the_plan_counts(tmp_path, stage):
    """DeepSpeed allocates its reduce buckets whatever the model (its default 5e8 elements: 2 GB of
    bf16 under ZeRO-2's double buffer); tinytrain's config sizes them hidden^2 with a 2^24 floor, and
    the plan counts them among the gradients (plan/deepspeed_config.py). Read from DeepSpeed's own
    ZeRO optimizer on two ranks."""
    from tinytrain.plan.deepspeed_config import REDUCE_BUCKET_FLOOR, bucket_bytes

    run = [*RUN, f"parallel=zero{stage}", "cluster.devices=2", "parallel.deepspeed_on_cpu=true"]
    run_ranks("tests.integration.step_peak_worker", [str(tmp_path), *run], 2, env={"OMP_NUM_THREADS": "1"}, local_rank=True)
    read = json.loads((tmp_path / "step_peak.json").read_text())["buckets"]
    planned = plan(small_with(run), tmp_path / "plan")
    assert planned["deepspeed"]["zero_optimization"]["reduce_bucket_size"] == REDUCE_BUCKET_FLOOR  # 128^2 is below the floor
    assert set(read) == {bucket_bytes(stage, REDUCE_BUCKET_FLOOR, 2)}, read  # bf16, as the run trains


def test_a_zero2_rank_s_step_peaks_within_what_the_plan_counts(tmp_path):
    """Under ZeRO torch's AdamW steps DeepSpeed's flat fp32 partition, one tensor per parameter group:
    its temporaries (the per-tensor loop's on a CPU) are a whole partition's, and with little
    activation memory (micro batch 1 x 32) the step peaks there. The count before plan/step_peak.py
    counted them (none under DeepSpeed) was under what two ranks read; benchmarks/step_peak_ranks.py
    reads 5M-150M parameters under ZeRO-1, 2 and 3 (at this size ZeRO-3's persistent buffers, in the
    step's start, leave its reading under the count before). Reduce buckets of 2^18 elements, so that
    the 2^24 floor's 64 MiB do not hide the step."""
    from benchmarks.allocator_count import has_mallinfo2

    if not has_mallinfo2():
        pytest.skip("glibc before 2.33 has no mallinfo2")
    run = [*RUN, "trainer.micro_batch_size=1", "data.seq_len=32", "parallel=zero2", "cluster.devices=2", "parallel.deepspeed_on_cpu=true",
           "+parallel.deepspeed_overrides.zero_optimization.reduce_bucket_size=262144"]
    run_ranks("tests.integration.step_peak_worker", [str(tmp_path), *run], 2, env={"MALLOC_ARENA_MAX": "1", "OMP_NUM_THREADS": "1"}, local_rank=True)
    measured = max(json.loads((tmp_path / "step_peak.json").read_text())["peaks"][1:])
    memory = plan(small_with(run), tmp_path / "plan")["memory_per_gpu"]
    assert memory["step"]["peak_at"] == "optimizer_step" and memory["step"]["optimizer_kernel"] == "per-tensor"
    assert 0.5 * above_states(memory) < measured <= above_states(memory), (measured, memory)
    assert measured > (memory["grads_gib"] + memory["activations_gib"]) * 2**30, (measured, memory)  # the count without them, gradients held beside the activations

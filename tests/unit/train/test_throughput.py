"""FLOPs accounting (hand counts), MFU's peak selection, fast-path choice and the chunked loss."""

import pytest
import torch
from omegaconf import OmegaConf

from tinytrain.config.schema import Strategy
from tinytrain.model.chunked_loss import chunked_lm_loss
from tinytrain.model.module import causal_lm_loss
from tinytrain.plan.fast_paths import select_fast_paths
from tinytrain.plan.flops import batch_flops, matmul_parameters
from tinytrain.plan.hardware import CPU, gpu_from_device_name, lookup_gpu
from tinytrain.plan.model_shape import ModelShape, parameter_count
from tinytrain.plan.precision import Dtype
from tinytrain.train.callbacks.throughput import ThroughputMonitor, peak_tflops

SMALL = ModelShape(hidden=8, layers=2, heads=2, kv_heads=1, intermediate=16, vocab=32, tied_embeddings=False, qkv_bias=False)


def test_parameter_count_by_hand():
    # embedding 32x8 = 256; per layer q 8x8 = 64, k and v 8x4 = 32 each, o 64, MLP 3x8x16 = 384,
    # two norms 16 -> 592; two layers 1184; final norm 8; lm_head 256.
    assert parameter_count(SMALL) == 256 + 1184 + 8 + 256 == 1704
    assert matmul_parameters(SMALL) == 1704 - 256  # the embedding lookup is not a matmul


def test_batch_flops_by_hand():
    # 2 sequences of 5 tokens: 6 x 1448 x 10 + 12 x layers 2 x heads 2 x head_dim 4 x (25 + 25)
    assert batch_flops(SMALL, tokens=10, sum_squared_lengths=50) == 86_880 + 9_600


def test_packed_batches_use_squared_document_lengths():
    from tinytrain.data.collate import COUNTS, collate_windows, tokens_and_squares

    def windows(position_ids):
        return collate_windows([{"input_ids": torch.zeros(5, dtype=torch.long), "position_ids": row} for row in position_ids])

    assert windows(torch.tensor([[0, 1, 2, 0, 1], [0, 1, 2, 3, 4]]))[COUNTS] == (10, (9 + 4) + 25)
    # A row that starts inside a document (a window of a long one) counts its span from the row's
    # start; a batch without the collator's boundaries (one from elsewhere) is counted the same.
    batch = windows(torch.tensor([[0, 1, 2, 0, 1], [7, 8, 0, 1, 2]]))
    assert batch[COUNTS] == (10, (9 + 4) + (4 + 9))
    assert tokens_and_squares({"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}) == batch[COUNTS]


def test_peak_by_precision_and_graceful_omission():
    h100 = lookup_gpu("H100")
    assert peak_tflops(h100, Dtype.bf16)[0] == 989.0
    assert peak_tflops(lookup_gpu("V100"), Dtype.fp16)[0] == 125.0
    assert peak_tflops(lookup_gpu("A800"), Dtype.bf16)[0] == 312.0
    for hw, precision, why in [
        (gpu_from_device_name("NVIDIA Future 9000", (10, 0)), Dtype.bf16, "not in the hardware table"),
        (CPU(), Dtype.fp32, "CPU"),
        (h100, Dtype.fp32, "fp32"),
    ]:
        peak, note = peak_tflops(hw, precision)
        assert peak is None and why in note
        monitor = ThroughputMonitor(SMALL, peak, note)
        monitor._measured.extend((1, 100, 1e6, 1.0))
        assert monitor.summary() == {"tokens_per_s_per_device": 100.0, "mfu": None, "note": note, "left_out": {"compiling": 0, "profiling": 0}}


def test_the_summary_leaves_out_steps_that_compile_or_are_profiled():
    """A block compiled again mid-run (its first packed-documents mask, the grad mode after
    validation) or a step the profiler traces runs many times slower: the run's rate is the steady
    one, and the summary says how many steps it left out."""
    from types import SimpleNamespace

    from tinytrain.data.collate import COUNTS

    monitor = ThroughputMonitor(SMALL, None, "cpu", profiled=lambda n: n == 4)
    trainer_ = SimpleNamespace(global_step=0, max_steps=100, _logger_connector=SimpleNamespace(should_update_logs=False), fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=0)))
    double = torch.compile(lambda x: x * 2, backend="eager")
    for step in range(1, 7):
        if step in (1, 3):  # the first step compiles; step 3 compiles again for a new shape
            double(torch.ones(step))
        trainer_.global_step = step
        monitor.on_train_batch_end(trainer_, None, None, {COUNTS: (10, 50)}, step)
    # steps 2..6 are measured: 3 compiled, the 5th (process index 4) profiled -> 2, 4 and 6 counted
    tokens, _, _, left_out = monitor.steady()
    assert left_out == {"compiling": 1, "profiling": 1} and tokens == 30
    # Another rank compiled in the 6th step (index 5): this rank waited for it, and leaves it out too.
    monitor.compiled.add(5)
    tokens, _, _, left_out = monitor.steady()
    assert left_out == {"compiling": 2, "profiling": 1} and tokens == 20


def trainer(**kw):
    return OmegaConf.create({"compile": False, "compile_backend": "inductor", "activation_checkpointing": False, "loss_chunk_tokens": None, "liger": None, **kw})


@pytest.mark.parametrize(
    "strategy, on_gpu, vocab, fused, chunk",
    [
        (Strategy.single, True, 32000, True, 0),
        (Strategy.ddp, True, 128256, True, 1024),
        (Strategy.single, False, 128256, False, 1024),
        (Strategy.deepspeed, True, 128256, False, 1024),
        (Strategy.fsdp_tp, True, 128256, False, 1024),
        (Strategy.single, False, 4096, False, 0),
    ],
)
def test_fast_path_selection(strategy, on_gpu, vocab, fused, chunk):
    f = select_fast_paths(trainer(), strategy, on_gpu=on_gpu, padded_vocab=vocab)
    assert (f.fused_adamw, f.loss_chunk_tokens, f.compile, f.activation_checkpointing) == (fused, chunk, "none", "none")
    assert set(f.reasons) == {"fused_adamw", "loss_chunk_tokens", "compile", "activation_checkpointing", "liger"}
    assert not f.liger  # liger-kernel is not installed here (tests/unit/plan/test_fast_paths.py covers it)


def test_fast_path_overrides():
    f = select_fast_paths(trainer(compile=True, activation_checkpointing=True, loss_chunk_tokens=256), Strategy.single, on_gpu=False, padded_vocab=4096)
    assert (f.compile, f.activation_checkpointing, f.loss_chunk_tokens) == ("model", "full", 256)  # the old booleans
    f = select_fast_paths(trainer(compile="blocks", activation_checkpointing="selective"), Strategy.single, on_gpu=False, padded_vocab=4096)
    assert (f.compile, f.activation_checkpointing, f.checkpoint_every) == ("blocks", "selective", 1)
    assert select_fast_paths(trainer(loss_chunk_tokens=0), Strategy.single, on_gpu=True, padded_vocab=128256).loss_chunk_tokens == 0
    # fsdp_tp's vocab-sharded head gathers each chunk's logits (model/chunked_loss.py)
    assert select_fast_paths(trainer(loss_chunk_tokens=256), Strategy.fsdp_tp, on_gpu=True, padded_vocab=128256).loss_chunk_tokens == 256


def test_chunked_loss_equals_full_loss_and_gradients():
    torch.manual_seed(0)
    true_vocab, padded, hidden = 100, 128, 16
    h = torch.randn(3, 7, hidden, requires_grad=True)
    w = torch.randn(padded, hidden, requires_grad=True)
    labels = torch.randint(0, true_vocab, (3, 7))
    labels[0, :2] = -100
    full = causal_lm_loss(h @ w.T, labels, true_vocab)
    full.backward()
    grads = h.grad.clone(), w.grad.clone()
    h.grad, w.grad = None, None
    chunked = chunked_lm_loss(h, w, labels, true_vocab=true_vocab, chunk_tokens=4)
    chunked.backward()
    torch.testing.assert_close(chunked, full)
    torch.testing.assert_close(h.grad, grads[0])
    torch.testing.assert_close(w.grad, grads[1])
    assert torch.all(w.grad[true_vocab:] == 0)  # padding rows get no gradient


def test_packed_sft_rows_count_no_padding():
    import numpy as np

    from tinytrain.data.collate import COUNTS, PaddedCollator, tokens_and_squares
    from tinytrain.data.packing import PackedSamples
    from tinytrain.data.sft import SftSample

    lengths = [9, 5, 12, 3, 7]  # rows of capacity 16: [12, 3], [9, 7], [5] -> padded to width 16
    samples = [SftSample(np.arange(n) + 5, np.full(n, -100)) for n in lengths]
    rows = PackedSamples(samples, capacity=16)
    batch = PaddedCollator(pad_id=0, multiple=8)([rows[i] for i in range(len(rows))])
    assert batch["input_ids"].shape == (3, 16)
    tokens, squares = tokens_and_squares(batch)
    assert tokens == sum(lengths) == 36  # not 3 x 16 = 48
    assert squares == sum(n * n for n in lengths)
    assert batch[COUNTS] == (tokens, squares)  # counted by the collator, on the CPU


def test_the_ranks_sharing_a_batch_count_its_tokens_once_and_samples_are_not_training_time(tmp_path):
    """Under fsdp_tp tp 2 both ranks of the pair see one batch and each computes half of it: each
    logged the pair's tokens/s (and MFU) as its own. Sample generations at validation's end ran
    after the monitor had closed validation's pause, and counted as the next step's time."""
    import lightning.pytorch as pl

    from tests.conftest import compose
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.plan.planner import make_plan
    from tinytrain.train.trainer import build_trainer

    cfg = compose(["experiment=smoke", "parallel=fsdp_tp", "parallel.tp=2", "cluster.devices=2"])
    plan = make_plan(cfg, load_from_config(cfg.tokenizer), tmp_path)
    samples = pl.Callback()
    built = build_trainer(cfg, plan, tmp_path, at_validation_end=[samples])
    assert built.throughput.ranks_per_batch == 2
    callbacks = built.trainer.callbacks
    assert callbacks.index(samples) < callbacks.index(built.throughput)

    from types import SimpleNamespace

    from tinytrain.data.collate import COUNTS

    monitor = ThroughputMonitor(SMALL, None, "cpu", ranks_per_batch=4)
    trainer_ = SimpleNamespace(global_step=0, max_steps=100, _logger_connector=SimpleNamespace(should_update_logs=False), fit_loop=SimpleNamespace(epoch_loop=SimpleNamespace(_batches_that_stepped=0)))
    for step in (1, 2):
        trainer_.global_step = step
        monitor.on_train_batch_end(trainer_, None, None, {COUNTS: (100, 500)}, step)
    assert monitor.steady()[0] == 25  # step 2's 100 tokens over the 4 ranks that share them

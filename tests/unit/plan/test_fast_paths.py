"""liger-kernel as a fast path: chosen where it can run (a CUDA GPU, installed, not fsdp_tp), with
its reason; never on a CPU; its fused loss replaces the chunked loss except under ZeRO-3. Its
numerics against the plain loss run where a GPU and liger-kernel are (marker `gpu`)."""

import pytest
import torch
from omegaconf import OmegaConf

from tinytrain.config.schema import Strategy
from tinytrain.errors import ConfigError
from tinytrain.plan.fast_paths import liger_installed, select_fast_paths
from tinytrain.plan.hardware import CPU, lookup_gpu


def trainer(**kw):
    return OmegaConf.create({"compile": False, "compile_backend": "inductor", "activation_checkpointing": False, "loss_chunk_tokens": None, "liger": None, **kw})


@pytest.mark.parametrize("gpu", ["V100", "T4", "A800", "H100"])
@pytest.mark.parametrize("installed", [True, False])
def test_liger_where_installed_on_any_cuda_gpu(gpu, installed):
    on_gpu = not lookup_gpu(gpu).is_cpu  # Triton runs from compute capability 7.0: V100 and T4 too
    f = select_fast_paths(trainer(), Strategy.single, on_gpu=on_gpu, padded_vocab=128256, liger_available=installed)
    assert (f.liger, f.liger_loss) == (installed, installed)
    assert f.loss_chunk_tokens == (0 if installed else 1024)  # the fused loss never builds logits
    assert ("fused linear cross-entropy" if installed else "not installed") in f.reasons["liger"]


def test_never_on_cpu_and_an_explicit_request_there_is_an_error():
    f = select_fast_paths(trainer(), Strategy.single, on_gpu=not CPU().is_cpu, padded_vocab=128256, liger_available=True)
    assert not f.liger and not f.liger_loss and f.reasons["liger"].startswith("off: CPU")
    assert f.loss_chunk_tokens == 1024  # the chunked loss stays for CPU
    with pytest.raises(ConfigError, match=r"trainer.liger=true: liger-kernel cannot run here \(CPU"):
        select_fast_paths(trainer(liger=True), Strategy.single, on_gpu=False, padded_vocab=4096, liger_available=True)


def test_fsdp_tp_chunks_the_loss_without_liger_and_zero3_keeps_the_kernels_but_not_the_fused_loss():
    f = select_fast_paths(trainer(), Strategy.fsdp_tp, on_gpu=True, padded_vocab=128256, liger_available=True)
    assert (f.liger, f.liger_loss, f.loss_chunk_tokens) == (False, False, 1024)
    with pytest.raises(ConfigError, match="fsdp_tp"):
        select_fast_paths(trainer(liger=True), Strategy.fsdp_tp, on_gpu=True, padded_vocab=4096, liger_available=True)
    z3 = select_fast_paths(trainer(), Strategy.deepspeed, on_gpu=True, padded_vocab=128256, liger_available=True, zero_stage=3)
    assert (z3.liger, z3.liger_loss, z3.loss_chunk_tokens) == (True, False, 1024) and "ZeRO-3" in z3.reasons["liger"]
    z2 = select_fast_paths(trainer(), Strategy.deepspeed, on_gpu=True, padded_vocab=32000, liger_available=True, zero_stage=2)
    assert (z2.liger, z2.liger_loss) == (True, True)


def test_the_plan_says_how_zero3_compiles():
    """Under ZeRO-3 compiled blocks run inside DeepSpeed's hooks and compile once, the whole model
    breaks at every layer (measured: plan/fast_paths.py); the plan says so only under ZeRO-3."""
    z3 = {mode: select_fast_paths(trainer(compile=mode), Strategy.deepspeed, on_gpu=True, padded_vocab=32000, zero_stage=3) for mode in ("blocks", "model")}
    assert z3["blocks"].compile == "blocks" and "inside DeepSpeed's hooks" in z3["blocks"].reasons["compile"] and "no graph break" in z3["blocks"].reasons["compile"]
    assert z3["model"].compile == "model" and "41 graph breaks" in z3["model"].reasons["compile"] and "trainer.compile=blocks compiles each layer whole" in z3["model"].reasons["compile"]
    for mode in ("blocks", "model"):
        assert "ZeRO-3" not in select_fast_paths(trainer(compile=mode), Strategy.deepspeed, on_gpu=True, padded_vocab=32000, zero_stage=2).reasons["compile"]
    assert "ZeRO-3" not in select_fast_paths(trainer(), Strategy.deepspeed, on_gpu=True, padded_vocab=32000, zero_stage=3).reasons["compile"]


def test_a_long_sequence_turns_the_chunked_loss_on_whatever_the_vocab():
    """Llama-2's 32,000 rows at 32k tokens: the plain loss's backward would hold 12 GiB a sequence
    (its log-softmax and two gradients), so the loss is chunked; at 16k (6 GiB) it stays plain."""
    at = {seq: select_fast_paths(trainer(), Strategy.deepspeed, on_gpu=True, padded_vocab=32000, zero_stage=3, seq_len=seq) for seq in (16384, 32768)}
    assert at[16384].loss_chunk_tokens == 0 and at[16384].reasons["loss_chunk_tokens"] == "off: vocab 32000 < 65536"
    assert at[32768].loss_chunk_tokens == 1024
    assert at[32768].reasons["loss_chunk_tokens"] == "32768 tokens x vocab 32000: the plain loss's backward would hold 12 GiB a sequence: logits computed 1024 tokens at a time"
    fsdp = select_fast_paths(trainer(), Strategy.fsdp_tp, on_gpu=True, padded_vocab=32000, seq_len=32768)
    assert fsdp.loss_chunk_tokens == 1024  # the vocab-sharded head gathers each chunk's logits
    assert select_fast_paths(trainer(loss_chunk_tokens=0), Strategy.single, on_gpu=True, padded_vocab=32000, seq_len=32768).loss_chunk_tokens == 0


def test_switched_off_or_required():
    assert not select_fast_paths(trainer(liger=False), Strategy.single, on_gpu=True, padded_vocab=4096, liger_available=True).liger
    required = select_fast_paths(trainer(liger=True), Strategy.single, on_gpu=True, padded_vocab=4096, liger_available=False)
    assert required.liger and "not installed on this machine" in required.reasons["liger"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or not liger_installed(), reason="needs a CUDA GPU and liger-kernel (pip install -e '.[gpu]')")
def test_liger_fused_loss_and_kernels_match_the_plain_path():
    from tests.unit.data.test_packing import tiny_llama
    from tinytrain.config.schema import Arch
    from tinytrain.model.liger import apply_kernels, fused_linear_cross_entropy
    from tinytrain.model.module import causal_lm_loss

    torch.manual_seed(0)
    hidden = torch.randn(4, 64, 256, device="cuda", requires_grad=True)
    weight = torch.randn(4160, 256, device="cuda", requires_grad=True)  # 4096 true rows + padding
    labels = torch.randint(0, 4096, (4, 64), device="cuda")
    labels[:, ::7] = -100
    fused = fused_linear_cross_entropy(hidden, weight, labels, 4096)
    plain = causal_lm_loss(hidden @ weight.T, labels, 4096)
    torch.testing.assert_close(fused, plain, atol=1e-4, rtol=1e-4)
    g_fused = torch.autograd.grad(fused, (hidden, weight))
    g_plain = torch.autograd.grad(plain, (hidden, weight))
    for a, b in zip(g_fused, g_plain):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)
    assert g_fused[1][4096:].abs().max() == 0  # padded rows get no gradient

    ids = torch.randint(0, 4096, (2, 32), device="cuda")
    model = tiny_llama("sdpa").cuda()
    with torch.no_grad():
        plain_logits = model(input_ids=ids).logits
        apply_kernels(model, Arch.llama)  # RoPE is patched module-wide: plain logits come first
        torch.testing.assert_close(model(input_ids=ids).logits, plain_logits, atol=1e-4, rtol=1e-4)


def test_liger_requested_where_it_is_missing_is_a_note_in_a_plan_and_refused_where_it_runs():
    planned = select_fast_paths(trainer(liger=True), Strategy.single, on_gpu=True, padded_vocab=4096, liger_available=False, planning=True)
    assert planned.liger and "the one that trains needs it" in planned.reasons["liger"]
    with pytest.raises(ConfigError, match=r"trainer.liger=true: needs liger-kernel, which is not installed here. Fix: pip install 'tinytrain-llm\[gpu\]'"):
        select_fast_paths(trainer(liger=True), Strategy.single, on_gpu=True, padded_vocab=4096, liger_available=False, planning=False)

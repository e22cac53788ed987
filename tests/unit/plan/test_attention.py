"""Attention choice from the hardware table and what the installed torch offers: torch's varlen
kernel > flash-attn 2 > SDPA with the block-diagonal mask, each with its reason; an explicit varlen
or flash_attention_2 that cannot run is a configuration error naming the GPU (or the torch) and the
fix. torch's capability is simulated by reading the signature of a function shaped like each
release's varlen_attn (plan/torch_varlen.py's seam), not by replacing the kernel."""

import pytest

from tests.conftest import run_cli
from tinytrain.config.schema import Attention
from tinytrain.errors import ConfigError
from tinytrain.model.flash_reference import varlen_attn_2_10, varlen_attn_reference
from tinytrain.plan.attention import choose_attention
from tinytrain.plan.hardware import CPU, lookup_gpu
from tinytrain.plan.torch_varlen import read_support

TORCH = {"2.12": read_support(varlen_attn_reference, "2.12"), "2.10": read_support(varlen_attn_2_10, "2.10"), "none": read_support(None, "2.9.1")}

CASES = [
    # gpu, torch's varlen, flash-attn installed, sliding window, chosen, words of the reason
    ("H100", "2.12", False, False, "torch_varlen", "torch 2.12's varlen kernel (packed documents by cu_seq_lens) on H100-SXM (compute capability 9.0)"),
    ("H100", "2.12", True, False, "torch_varlen", "torch 2.12's varlen kernel"),
    ("A800", "2.10", True, False, "torch_varlen", "A800 (compute capability 8.0)"),
    ("A800", "2.12", False, True, "torch_varlen", "torch 2.12's varlen kernel"),
    ("A800", "2.10", True, True, "flash_attention_2", "torch 2.10's varlen_attn takes no window_size"),
    ("A800", "2.10", False, True, "sdpa", "takes no window_size (the model's sliding window) and flash-attn is not installed"),
    ("H100", "none", True, False, "flash_attention_2", "torch 2.9.1 has no torch.nn.attention.varlen"),
    ("H100", "none", False, False, "sdpa", "block-diagonal mask because torch 2.9.1 has no torch.nn.attention.varlen (it needs torch >= 2.10) and flash-attn is not installed"),
    ("V100", "2.12", True, False, "sdpa", "need compute capability >= 8.0 and V100 (compute capability 7.0) has less"),
    ("V100", "none", False, False, "sdpa", "V100 (compute capability 7.0) has less"),
    ("T4", "2.12", True, False, "sdpa", "T4 (compute capability 7.5) has less"),
    ("T4", "2.10", False, False, "sdpa", "T4 (compute capability 7.5) has less"),
]


@pytest.mark.parametrize("gpu, torch_varlen, installed, window, chosen, why", CASES)
def test_auto_attention_by_gpu_torch_and_install(gpu, torch_varlen, installed, window, chosen, why):
    choice = choose_attention(Attention.auto, flash_installed=installed, varlen=TORCH[torch_varlen], hardware=lookup_gpu(gpu), sliding_window=window)
    assert choice.implementation == chosen
    assert why in choice.reason, choice.reason


def test_soft_capping_passes_over_torch_varlen():
    choice = choose_attention(Attention.auto, flash_installed=True, varlen=TORCH["2.12"], hardware=lookup_gpu("H100"), softcap=True)
    assert choice.implementation == "flash_attention_2" and "soft-capping" in choice.reason


@pytest.mark.parametrize("torch_varlen", list(TORCH))
def test_cpu_gets_sdpa_and_explicit_choices_are_kept(torch_varlen):
    support = TORCH[torch_varlen]
    assert choose_attention(Attention.auto, flash_installed=True, varlen=support, hardware=CPU()).implementation == "sdpa"
    assert "no GPU" in choose_attention(Attention.auto, flash_installed=True, varlen=support, hardware=CPU()).reason
    assert choose_attention(Attention.eager, flash_installed=True, varlen=support, hardware=lookup_gpu("H100")).implementation == "eager"
    assert choose_attention(Attention.sdpa, flash_installed=True, varlen=support, hardware=lookup_gpu("A800")).implementation == "sdpa"
    assert choose_attention(Attention.flash_attention_2, flash_installed=True, varlen=support, hardware=lookup_gpu("A800")).implementation == "flash_attention_2"
    # planned on a login node without flash-attn for a GPU that has it: kept, with a note
    note = choose_attention(Attention.flash_attention_2, flash_installed=False, varlen=support, hardware=lookup_gpu("H100")).reason
    assert "not installed on this machine" in note


def test_explicit_varlen_where_it_runs():
    assert choose_attention(Attention.varlen, flash_installed=False, varlen=TORCH["2.12"], hardware=lookup_gpu("A800"), sliding_window=True).implementation == "torch_varlen"
    assert choose_attention(Attention.varlen, flash_installed=False, varlen=TORCH["2.10"], hardware=lookup_gpu("H100")).implementation == "torch_varlen"


@pytest.mark.parametrize(
    "gpu, torch_varlen, window, words, fix",
    [
        ("V100", "2.12", False, "V100 (compute capability 7.0)", "model.attention=auto"),
        ("T4", "2.12", False, "T4 (compute capability 7.5)", "model.attention=auto"),
        ("cpu", "2.12", False, "this run is on cpu", "model.attention=auto"),
        ("H100", "none", False, "torch 2.9.1 has no torch.nn.attention.varlen (it needs torch >= 2.10)", "install torch >= 2.10"),
        ("A800", "2.10", True, "takes no window_size", "model.attention=auto"),
    ],
)
def test_explicit_varlen_where_it_cannot_run_is_a_config_error(gpu, torch_varlen, window, words, fix):
    hardware = CPU() if gpu == "cpu" else lookup_gpu(gpu)
    with pytest.raises(ConfigError) as e:
        choose_attention(Attention.varlen, flash_installed=True, varlen=TORCH[torch_varlen], hardware=hardware, sliding_window=window)
    message = str(e.value)
    assert "model.attention='varlen'" in message and words in message and fix in message, message


@pytest.mark.parametrize("gpu", ["V100", "T4"])
@pytest.mark.parametrize("installed", [True, False])
def test_explicit_flash_on_a_pre_ampere_gpu_is_a_config_error(gpu, installed):
    with pytest.raises(ConfigError) as e:
        choose_attention(Attention.flash_attention_2, flash_installed=installed, varlen=TORCH["2.12"], hardware=lookup_gpu(gpu))
    message = str(e.value)
    assert "model.attention='flash_attention_2'" in message and gpu in message and "compute capability >= 8.0" in message
    assert "Fix: use model.attention=sdpa" in message


def test_explicit_flash_on_cpu_is_a_config_error():
    with pytest.raises(ConfigError, match="this run is on cpu"):
        choose_attention(Attention.flash_attention_2, flash_installed=True, varlen=TORCH["2.12"], hardware=CPU())


def test_plan_for_a_v100_refuses_flash_attention_and_names_the_fix(tmp_path):
    result = run_cli(["mode=plan", "hardware.gpu=V100", "model.attention=flash_attention_2"], tmp_path / "run")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "V100 (compute capability 7.0)" in result.stderr and "model.attention=sdpa" in result.stderr


@pytest.mark.parametrize("where", [["hardware.gpu=T4", "mode=plan"], []])  # []: a training run on this CPU
def test_varlen_on_a_t4_or_a_cpu_run_stops_before_work_with_the_fix(tmp_path, where):
    result = run_cli([*where, "model.attention=varlen"], tmp_path / "run")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "model.attention='varlen'" in result.stderr and "model.attention=auto" in result.stderr and "Traceback" not in result.stderr
    assert ("T4 (compute capability 7.5)" if "hardware.gpu=T4" in where else "this run is on cpu") in result.stderr


def test_plan_for_an_h100_picks_torch_varlen_and_says_why(tmp_path):
    result = run_cli(["mode=plan", "hardware.gpu=H100"], tmp_path / "run")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "attention  torch_varlen: torch 2.13.0's varlen kernel (packed documents by cu_seq_lens) on H100-SXM" in result.stdout


def test_flash_requested_where_it_is_missing_is_a_note_in_a_plan_and_refused_where_it_runs():
    """The machine that trains without flash-attn built the data and the model, then transformers
    refused (exit 1); a plan for another machine only notes it."""
    planned = choose_attention(Attention.flash_attention_2, flash_installed=False, varlen=TORCH["2.12"], hardware=lookup_gpu("A100"), planning=True)
    assert planned.implementation == "flash_attention_2" and "the one that trains needs it" in planned.reason
    with pytest.raises(ConfigError, match=r"model.attention='flash_attention_2': needs flash-attn, which is not installed here. Fix: pip install 'tinytrain-llm\[flash-attn\]'"):
        choose_attention(Attention.flash_attention_2, flash_installed=False, varlen=TORCH["2.12"], hardware=lookup_gpu("A100"), planning=False)

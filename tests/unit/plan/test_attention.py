"""Attention choice from the hardware table: flash-attn 2 only where installed and the GPU has
compute capability >= 8.0, SDPA elsewhere, and an explicit flash_attention_2 that cannot run is a
configuration error naming the GPU and the fix."""

import pytest

from tests.conftest import run_cli
from tinytrain.config.schema import Attention
from tinytrain.errors import ConfigError
from tinytrain.plan.attention import choose_attention
from tinytrain.plan.hardware import CPU, lookup_gpu

CASES = [
    # gpu, flash-attn installed, chosen, words of the reason
    ("V100", True, "sdpa", "V100 (compute capability 7.0) has less"),
    ("V100", False, "sdpa", "V100 (compute capability 7.0) has less"),
    ("T4", True, "sdpa", "T4 (compute capability 7.5) has less"),
    ("T4", False, "sdpa", "T4 (compute capability 7.5) has less"),
    ("A800", True, "flash_attention_2", "A800 (compute capability 8.0) has compute capability >= 8.0"),
    ("A800", False, "sdpa", "flash-attn is not installed"),
    ("H100", True, "flash_attention_2", "H100-SXM (compute capability 9.0) has compute capability >= 8.0"),
    ("H100", False, "sdpa", "flash-attn is not installed"),
]


@pytest.mark.parametrize("gpu, installed, chosen, why", CASES)
def test_auto_attention_by_gpu_and_install(gpu, installed, chosen, why):
    choice = choose_attention(Attention.auto, installed, lookup_gpu(gpu))
    assert choice.implementation == chosen
    assert why in choice.reason


def test_cpu_gets_sdpa_and_explicit_choices_are_kept():
    assert choose_attention(Attention.auto, True, CPU()).implementation == "sdpa"
    assert "no GPU" in choose_attention(Attention.auto, True, CPU()).reason
    assert choose_attention(Attention.eager, True, lookup_gpu("H100")).implementation == "eager"
    assert choose_attention(Attention.sdpa, True, lookup_gpu("A800")).implementation == "sdpa"
    assert choose_attention(Attention.flash_attention_2, True, lookup_gpu("A800")).implementation == "flash_attention_2"
    # planned on a login node without flash-attn for a GPU that has it: kept, with a note
    note = choose_attention(Attention.flash_attention_2, False, lookup_gpu("H100")).reason
    assert "not installed on this machine" in note


@pytest.mark.parametrize("gpu", ["V100", "T4"])
@pytest.mark.parametrize("installed", [True, False])
def test_explicit_flash_on_a_pre_ampere_gpu_is_a_config_error(gpu, installed):
    with pytest.raises(ConfigError) as e:
        choose_attention(Attention.flash_attention_2, installed, lookup_gpu(gpu))
    message = str(e.value)
    assert "model.attention='flash_attention_2'" in message and gpu in message and "compute capability >= 8.0" in message
    assert "Fix: use model.attention=sdpa" in message


def test_explicit_flash_on_cpu_is_a_config_error():
    with pytest.raises(ConfigError, match="this run is on cpu"):
        choose_attention(Attention.flash_attention_2, True, CPU())


def test_plan_for_a_v100_refuses_flash_attention_and_names_the_fix(tmp_path):
    result = run_cli(["mode=plan", "hardware.gpu=V100", "model.attention=flash_attention_2"], tmp_path / "run")
    assert result.returncode == 2, result.stderr[-2000:]
    assert "V100 (compute capability 7.0)" in result.stderr and "model.attention=sdpa" in result.stderr

"""Per-family decisions the plan makes: Gemma-2's loss comes from its own (soft-capped) logits,
and its attention is eager where SDPA would be picked."""

import pytest

from tests.conftest import compose
from tinytrain.config.schema import Attention, Strategy, TrainerConfig
from tinytrain.errors import ConfigError
from tinytrain.plan.attention import AttentionChoice, for_family
from tinytrain.plan.families import GEMMA2_SOFTCAP
from tinytrain.plan.fast_paths import select_fast_paths


def test_gemma2_keeps_its_soft_capped_logits():
    """Its 256000-row vocab would pick the chunked loss (and liger on a GPU): both skip the cap."""
    f = select_fast_paths(compose(["model=gemma2_2b"]).trainer, Strategy.single, on_gpu=True, padded_vocab=256000, liger_available=True, zero_stage=0, logits_only=GEMMA2_SOFTCAP)
    assert (f.loss_chunk_tokens, f.liger, f.liger_loss) == (0, False, False)
    assert "soft-caps" in f.reasons["loss_chunk_tokens"] and "soft-caps" in f.reasons["liger"]
    assert select_fast_paths(TrainerConfig(), Strategy.single, on_gpu=True, padded_vocab=256000, liger_available=False, zero_stage=0).loss_chunk_tokens == 1024  # other families
    with pytest.raises(ConfigError) as e:
        select_fast_paths(compose(["trainer.loss_chunk_tokens=512"]).trainer, Strategy.single, on_gpu=True, padded_vocab=256000, liger_available=False, zero_stage=0, logits_only=GEMMA2_SOFTCAP)
    assert "trainer.loss_chunk_tokens=512" in str(e.value) and "final_logit_softcapping" in str(e.value)


def test_eager_where_the_family_has_no_sdpa():
    sdpa = AttentionChoice("sdpa", "PyTorch SDPA because no GPU")
    assert for_family(sdpa, Attention.auto, "gemma2", sdpa_ok=False).implementation == "eager"
    assert for_family(sdpa, Attention.auto, "mistral", sdpa_ok=True) is sdpa
    flash = AttentionChoice("flash_attention_2", "flash-attn is installed")
    assert for_family(flash, Attention.auto, "gemma2", sdpa_ok=False) is flash

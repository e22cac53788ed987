"""A preset trained with another tokenizer than its published model's is named as not that model,
with the published size (plan/published.py); with the model's own tokenizer nothing is said."""

import pytest

from tests.conftest import LLAMA2_TOKENIZER, plan
from tests.unit.config.test_shipped_configs import PUBLISHED


def test_llama2_7b_with_the_bundled_tokenizer_is_not_llama2_7b(tmp_path):
    p = plan(["model=llama2_7b"], tmp_path)
    note = p["model"]["note"]
    assert p["params"]["total"] == 6_509_826_048
    # Llama-2-7B's published size: 6,738,415,616 parameters with its 32,000 rows.
    assert "the shape of Llama-2-7B, not Llama-2-7B itself" in note and "4,096 tokens, Llama-2-7B's 32,000" in note
    assert "6.51B parameters here, 6.74B published" in note and "tokenizer=hf tokenizer.path=" in note


def test_with_its_own_tokenizer_nothing_is_said(tmp_path):
    if not LLAMA2_TOKENIZER.exists():
        pytest.skip("../shared/data absent")
    assert plan(["model=llama2_7b", "tokenizer=llama2"], tmp_path)["model"]["note"] is None


def test_the_tiny_model_names_no_published_model(tmp_path):
    assert plan([], tmp_path)["model"]["note"] is None


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_presets_name_the_vocab_their_published_sizes_count(model, tmp_path):
    from tests.conftest import compose

    assert compose([f"model={model}"]).model.published_vocab == PUBLISHED[model][0]

"""The transformers config tinytrain builds for a preset is the published model's (what an export's
config.json says): keys transformers would otherwise fill with its defaults for another model."""

import pytest

from tests.conftest import compose
from tinytrain.model.build import hf_config


@pytest.mark.parametrize("model, layers", [("qwen3_8b", 36), ("qwen3_0_6b", 28), ("qwen2_5_7b", 28), ("qwen2_0_5b", 24)])
def test_qwen_window_layers_name_every_layer_as_published(model, layers, bundled_tokenizer):
    config = hf_config(compose([f"model={model}"]).model, 4096, bundled_tokenizer)
    # transformers' default is 28 whatever the depth; the published configs say num_hidden_layers.
    assert (config.num_hidden_layers, config.max_window_layers, config.use_sliding_window) == (layers, layers, False)

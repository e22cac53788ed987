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


@pytest.mark.parametrize("arch", ["gemma2", "gemma3_text"])
def test_gemma_without_a_window_attends_fully_and_runs(arch, bundled_tokenizer):
    """model.sliding_window=null: every layer attends fully. Their forward builds the windowed mask
    whatever the layers are and refused a config without a window: the first step crashed after the
    plan had accepted the run."""
    import torch
    from transformers import AutoModelForCausalLM

    from tinytrain.plan.families import family
    from tinytrain.plan.planner import uses_sliding_window

    cfg = compose(["experiment=smoke", f"model.arch={arch}"]).model
    config = hf_config(cfg, 4096, bundled_tokenizer)
    assert set(config.layer_types) == {"full_attention"}
    assert not uses_sliding_window(cfg, config, family(cfg.arch))  # an export of it asks no kernel for a window
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    with torch.no_grad():
        assert model(input_ids=torch.randint(0, 4096, (1, 16))).logits.shape == (1, 16, config.vocab_size)

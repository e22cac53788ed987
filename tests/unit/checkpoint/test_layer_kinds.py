"""A checkpoint of another model family with the same sizes is refused while planning
(plan/start_points.py check_layer_kinds): a llama run's weights under model.arch=qwen3 failed in
load_state_dict with missing q/k norms, after the plan had accepted them. Each family's own weights
(as a full model and through LoRA's adapters) pass under it."""

import pytest
import torch

from tests.conftest import compose
from tinytrain.checkpoint.format import saved_layer_kinds
from tinytrain.errors import ConfigError
from tinytrain.model.build import hf_config
from tinytrain.plan.model_shape import shape_from_config
from tinytrain.plan.start_points import check_layer_kinds

SIZES = ["model.num_layers=1", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
ARCHS = {
    "llama": [],
    "qwen2": [],
    "qwen3": ["model.head_dim=16"],
    "mistral": ["model.sliding_window=16"],
    "phi3": ["model.sliding_window=16"],
    "gemma2": ["model.sliding_window=16"],
    "gemma3_text": ["model.sliding_window=16"],
}


def model_cfg(arch: str):
    return compose(["experiment=smoke", *SIZES, f"model.arch={arch}", *ARCHS[arch]]).model


def weights(arch: str, bundled_tokenizer) -> dict:
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(hf_config(model_cfg(arch), 4096, bundled_tokenizer))
    return {f"model.{k}": v for k, v in model.state_dict().items()}  # as CausalLMModule saves them


@pytest.mark.parametrize("saved", list(ARCHS))
def test_another_family_is_refused_and_its_own_passes(saved, bundled_tokenizer):
    state = weights(saved, bundled_tokenizer)
    for arch in ARCHS:
        shape = shape_from_config(model_cfg(arch), 4096)
        same_layers = saved_layer_kinds(state) == saved_layer_kinds(weights(arch, bundled_tokenizer))
        if same_layers:  # its own family, or one whose layers hold the same weights (llama, mistral)
            check_layer_kinds(state, "x.ckpt", "checkpoint.init_from", shape)
            continue
        with pytest.raises(ConfigError) as e:
            check_layer_kinds(state, "x.ckpt", "checkpoint.init_from", shape)
        assert "holds another model family's layers" in str(e.value) and f"model.arch={arch}" in str(e.value)
    # Only Mistral's layers hold Llama's weights: every other family is told apart from it.
    assert (saved_layer_kinds(state) == saved_layer_kinds(weights("llama", bundled_tokenizer))) == (saved in ("llama", "mistral"))


def test_lora_adapters_are_looked_through(bundled_tokenizer):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(hf_config(model_cfg("qwen3"), 4096, bundled_tokenizer))
    adapted = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    state = {f"model.{k}": v for k, v in adapted.state_dict().items()}
    assert saved_layer_kinds(state) == saved_layer_kinds(weights("qwen3", bundled_tokenizer))
    check_layer_kinds(state, "x.ckpt", "resume", shape_from_config(model_cfg("qwen3"), 4096))

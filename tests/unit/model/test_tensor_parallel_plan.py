"""The tensor-parallel plan is read from the built model of each family (meta device: no weights),
and a family it cannot shard is refused by name, at validation and at build."""

import pytest
import torch

from tests.conftest import compose
from tinytrain.errors import ConfigError
from tinytrain.model.build import hf_config
from tinytrain.model.tensor_parallel import tp_plan
from tinytrain.plan.validate import validate

TINY = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128", "model.tie_word_embeddings=false"]


def meta_model(preset: str, bundled_tokenizer):
    from transformers import AutoModelForCausalLM

    cfg = compose([f"model={preset}", *TINY])
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(hf_config(cfg.model, 4096, bundled_tokenizer))


@pytest.mark.parametrize("preset", ["tiny", "qwen2_5_7b", "mistral_7b", "gemma2_2b", "qwen3_8b", "gemma3_1b"])
def test_plan_covers_every_projection_of_the_built_model(preset, bundled_tokenizer):
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    model = meta_model(preset, bundled_tokenizer)
    plan = tp_plan(model)
    linears = {name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    head_norms = {name for name in dict(model.named_modules()) if name.endswith(("q_norm", "k_norm"))}
    assert bool(head_norms) == preset.startswith(("qwen3", "gemma3"))
    # every projection, the lm_head, the embedding and Qwen3's / Gemma-3's per-head q/k norms
    assert set(plan) == linears | {"model.embed_tokens"} | head_norms
    assert all(type(plan[name]).__name__ == "HeadNormParallel" for name in head_norms)
    for i in range(2):
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "mlp.gate_proj", "mlp.up_proj"):
            assert type(plan[f"model.layers.{i}.{name}"]) is ColwiseParallel
        for name in ("self_attn.o_proj", "mlp.down_proj"):
            assert type(plan[f"model.layers.{i}.{name}"]) is RowwiseParallel


def test_fused_projections_are_refused_naming_the_family(bundled_tokenizer, tmp_path):
    with pytest.raises(ConfigError) as e:
        tp_plan(meta_model("phi3_mini", bundled_tokenizer))
    assert "phi3 family" in str(e.value) and "qkv_proj" in str(e.value) and "parallel=ddp" in str(e.value)
    # The same refusal before anything is built, from the family's transformers config class.
    with pytest.raises(ConfigError) as e:
        validate(compose(["mode=plan", "model=phi3_mini", "parallel=fsdp_tp", "cluster.devices=2"]))
    assert "parallel='fsdp_tp'" in str(e.value) and "phi3 family" in str(e.value)
    validate(compose(["mode=plan", "model=mistral_7b", "parallel=fsdp_tp", "cluster.devices=2"]))

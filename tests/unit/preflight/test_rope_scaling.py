"""model.rope_scaling against data.seq_len (preflight `positions`): each mistake triggers, the
healthy setups pass; from scratch (Llama-3.1's preset) and on a pretrained folder."""

import pytest
import torch

from tests.conftest import compose, plan, save_fresh_model
from tinytrain.cli import run_stages
from tinytrain.errors import ConfigError
from tinytrain.preflight.rope import position_problems, reach

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
TINY = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128", "model.max_position_embeddings=256"]


def test_reach_of_published_scalings():
    assert reach(131072, LLAMA3) == 131072  # Llama-3.1's config says more than 8192 x 8
    assert reach(32768, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}) == 131072  # Qwen2.5's YaRN
    assert reach(4096, None) == 4096


def test_position_problems_name_both_numbers():
    beyond = position_problems(262144, max_positions=131072, scaling=LLAMA3, trained_context=None, source="model.max_position_embeddings")
    assert [p.key for p in beyond] == ["data.seq_len"] and "131072 positions RoPE scaling llama3 x8 from 8192" in beyond[0].message
    unscaled = position_problems(16384, max_positions=8192, scaling=None, trained_context=None, source="model.max_position_embeddings")
    assert "RoPE has no scaling" in unscaled[0].message and "original_max_position_embeddings=8192" in unscaled[0].fix
    mismatch = position_problems(4096, max_positions=8192, scaling={**LLAMA3, "original_max_position_embeddings": 4096}, trained_context=8192, source="x")
    assert [p.key for p in mismatch] == ["model.rope_scaling.original_max_position_embeddings"] and "8192 positions model.pretrained was trained at" in mismatch[0].message
    assert position_problems(65536, max_positions=131072, scaling=LLAMA3, trained_context=8192, source="x") == []


def test_llama3_1_preset_plans_past_its_original_context_and_stops_beyond_its_reach(tmp_path):
    assert plan(["model=llama3_1_8b", "data.seq_len=16384"], tmp_path / "ok")["batch"]["seq_len"] == 16384
    with pytest.raises(ConfigError) as e:
        plan(["model=llama3_1_8b", "data.seq_len=262144"], tmp_path / "long")
    assert "[preflight positions]" in str(e.value) and "data.seq_len=262144" in str(e.value) and "131072" in str(e.value)
    with pytest.raises(ConfigError) as e:
        plan(["model=llama3_1_8b", "model.rope_scaling.original_max_position_embeddings=262144"], tmp_path / "orig")
    assert "model.rope_scaling.original_max_position_embeddings=262144" in str(e.value) and "above model.max_position_embeddings (131072)" in str(e.value)
    # Without scaling, Llama-3-8B stops at its 8192 positions before preflight (validation).
    with pytest.raises(ConfigError) as e:
        plan(["model=llama3_8b", "data.seq_len=16384"], tmp_path / "llama3")
    assert "max_position_embeddings(8192)" in str(e.value)


def test_malformed_scaling_is_refused_by_validation(tmp_path):
    with pytest.raises(ConfigError) as e:
        plan(["model=llama3_1_8b", "model.rope_scaling={rope_type:llama4,factor:8.0}"], tmp_path)
    assert "rope_type must be one of linear, dynamic, yarn, longrope, llama3" in str(e.value)
    with pytest.raises(ConfigError) as e:
        plan(["model=llama3_8b", "model.rope_scaling={rope_type:llama3,factor:0.5}"], tmp_path)
    message = str(e.value)
    assert "needs low_freq_factor, high_freq_factor, original_max_position_embeddings" in message and "model.rope_scaling.factor=0.5" in message


@pytest.fixture(scope="module")
def pretrained_256(tmp_path_factory, bundled_tokenizer):
    """A tiny 'pretrained' Llama trained at 256 positions, without scaling."""
    return save_fresh_model(tmp_path_factory.mktemp("pretrained_256"), TINY, bundled_tokenizer)


def test_scaling_a_pretrained_model_must_start_from_its_context(pretrained_256, tmp_path, bundled_tokenizer):
    from tinytrain.model.build import model_config
    from tinytrain.plan.planner import make_plan

    linear = "model.rope_scaling={rope_type:linear,factor:4.0,original_max_position_embeddings:%d}"
    with pytest.raises(ConfigError) as e:
        plan([*TINY, f"model.pretrained={pretrained_256}", linear % 128, "data.seq_len=512"], tmp_path / "mismatch")
    assert "original_max_position_embeddings=128" in str(e.value) and "256 positions model.pretrained was trained at" in str(e.value)
    with pytest.raises(ConfigError) as e:
        plan([*TINY, f"model.pretrained={pretrained_256}", linear % 256, "data.seq_len=2048"], tmp_path / "beyond")
    assert "longer than the 1024 positions RoPE scaling linear x4 from 256 reaches" in str(e.value)

    cfg = compose(["mode=plan", *TINY, f"model.pretrained={pretrained_256}", linear % 256, "data.seq_len=1024"])
    p = run_stages(cfg, tmp_path / "ok")
    assert p.preflight.findings == []
    config = model_config(cfg.model, make_plan(cfg, bundled_tokenizer, tmp_path / "ok").vocab.padded, bundled_tokenizer)  # what training builds
    assert config.rope_parameters["rope_type"] == "linear" and config.rope_parameters["factor"] == 4.0 and config.rope_parameters["rope_theta"] == 10000.0


def test_a_pretrained_model_trains_with_the_scaled_rope(pretrained_256, bundled_tokenizer):
    """model.rope_scaling on model.pretrained: the model training builds has the scaled RoPE (it
    kept the pretrained config's before), as the end-of-run export and the output modes say."""
    from tinytrain.model.build import build_model, model_config
    from tinytrain.plan.attention import AttentionChoice

    linear = "model.rope_scaling={rope_type:linear,factor:4.0,original_max_position_embeddings:256}"
    cfg = compose([*TINY, f"model.pretrained={pretrained_256}", linear])
    config = model_config(cfg.model, len(bundled_tokenizer), bundled_tokenizer)
    model = build_model(cfg.model, config, AttentionChoice("sdpa", "test"))
    unscaled = compose([*TINY, f"model.pretrained={pretrained_256}"]).model
    plain = build_model(unscaled, model_config(unscaled, len(bundled_tokenizer), bundled_tokenizer), AttentionChoice("sdpa", "test"))
    assert model.config.rope_parameters == config.rope_parameters and model.config.rope_parameters["rope_type"] == "linear"
    assert torch.allclose(model.model.rotary_emb.inv_freq, plain.model.rotary_emb.inv_freq / 4.0)  # linear x4: positions / 4

"""model.pretrained: the plan takes the folder's shape, not the composed preset's (model=tiny)."""

import pytest
from transformers import LlamaConfig, Qwen2Config

from tests.conftest import compose, plan
from tinytrain.errors import ConfigError
from tinytrain.plan.pretrained_shape import adopt


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("pretrained")
    # 32 heads, 8 kv heads: tp 8 divides both; model=tiny's 6 and 2 do not.
    LlamaConfig(hidden_size=256, num_hidden_layers=1, num_attention_heads=32, num_key_value_heads=8, intermediate_size=512, vocab_size=4096, max_position_embeddings=8192, rope_theta=500000.0, rms_norm_eps=1e-6).save_pretrained(root / "llama32")
    Qwen2Config(hidden_size=64, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128, vocab_size=4096, tie_word_embeddings=True).save_pretrained(root / "qwen_tied")
    return root


def test_tensor_parallel_is_checked_against_the_folder_s_heads(folders, tmp_path):
    """It was refused as "tp(8) must divide num_heads(6) of model=tiny"."""
    p = plan([f"model.pretrained={folders / 'llama32'}", "parallel=fsdp_tp", "parallel.tp=8", "cluster.devices=8", "hardware.gpu=H100"], tmp_path / "run")
    assert p["parallel"]["tp"] == 8 and p["model"]["pretrained"] == str(folders / "llama32")
    cfg = (tmp_path / "run" / "config_resolved.yaml").read_text()
    assert "num_heads: 32" in cfg and "num_kv_heads: 8" in cfg and "max_position_embeddings: 8192" in cfg  # the record is the model trained
    assert "rope_theta: 500000.0" in cfg and "rms_norm_eps: 1.0e-06" in cfg  # it said model=tiny's 10000.0 and 1e-05


def test_tied_embeddings_of_the_folder_are_refused_under_fsdp_tp(folders, tmp_path):
    """A tied Qwen2 folder planned under fsdp_tp (the preset is untied) and would fail building."""
    with pytest.raises(ConfigError) as e:
        plan([f"model.pretrained={folders / 'qwen_tied'}", "parallel=fsdp_tp", "cluster.devices=2", "hardware.gpu=A800"], tmp_path / "run")
    assert f"does not shard tied embeddings (model.pretrained={folders / 'qwen_tied'})" in str(e.value)


def test_a_shape_key_given_beside_the_folder_is_refused_when_it_disagrees(folders):
    """model.num_layers=1 beside a 2-layer folder was silently ignored: the weights decide."""
    cfg = compose([f"model.pretrained={folders / 'qwen_tied'}", "model.num_layers=3", "model.num_heads=4"])
    with pytest.raises(ConfigError) as e:
        adopt(cfg, {"num_layers", "num_heads"})
    problems = e.value.problems
    assert [p.key for p in problems] == ["model.num_layers"] and "has num_layers=1" in problems[0].message and "drop model.num_layers" in problems[0].fix
    agreeing = compose([f"model.pretrained={folders / 'qwen_tied'}", "model.num_heads=4"])
    adopt(agreeing, {"num_heads"})
    assert (agreeing.model.num_layers, agreeing.model.hidden_size, agreeing.model.tie_word_embeddings, agreeing.model.arch.value) == (1, 64, True, "qwen2")


LLAMA3_X4 = "model.rope_scaling={rope_type:llama3,factor:4.0,low_freq_factor:1.0,high_freq_factor:4.0,original_max_position_embeddings:8192}"


def test_a_context_extension_records_its_new_context(folders):
    """max_position_embeddings of a run that scales RoPE is the scaled context (the folder's 8192
    was kept, so the export said the extended model stops at 8192); as given where that is at least
    the folder's; less is refused."""
    extended = compose([f"model.pretrained={folders / 'llama32'}", LLAMA3_X4])
    adopt(extended, {"rope_scaling"})
    assert extended.model.max_position_embeddings == 32768
    given = compose([f"model.pretrained={folders / 'llama32'}", LLAMA3_X4, "model.max_position_embeddings=16384"])
    adopt(given, {"rope_scaling", "max_position_embeddings"})
    assert given.model.max_position_embeddings == 16384
    with pytest.raises(ConfigError, match="has max_position_embeddings=8192"):
        adopt(compose([f"model.pretrained={folders / 'llama32'}", LLAMA3_X4, "model.max_position_embeddings=4096"]), {"rope_scaling", "max_position_embeddings"})
    plain = compose([f"model.pretrained={folders / 'llama32'}"])
    adopt(plain, set())
    assert plain.model.max_position_embeddings == 8192

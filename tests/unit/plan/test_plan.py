"""plan.json's documented fields and the derivations behind them."""

import json

import pytest

from tests.conftest import compose, needs_llama2, plan
from tinytrain.cli import run_stages
from tinytrain.errors import ConfigError

DOCUMENTED = [
    "vocab.true", "vocab.padded", "vocab.multiple", "vocab.tp", "precision.value", "precision.reason",
    "precision.loss_scale", "hardware.gpu", "params.total", "world_size", "tokens_per_step",
]


def get(d, dotted):
    for part in dotted.split("."):
        d = d[part]
    return d


def test_plan_json_holds_documented_fields(tmp_path):
    plan([], tmp_path)
    written = json.loads((tmp_path / "plan.json").read_text())
    for field in DOCUMENTED:
        get(written, field)  # KeyError names the missing field
    assert written["hardware"]["gpu"] is None and written["precision"]["value"] == "32-true"


def test_v100_plan_is_fp16_with_policy(tmp_path):
    p = plan(["hardware.gpu=V100", "precision.loss_scale.window=500"], tmp_path)
    assert p["precision"]["value"] == "16-mixed"
    assert p["precision"]["loss_scale"]["window"] == 500
    assert p["hardware"]["gpu"] == "V100"


def test_batch_arithmetic_from_global_batch(tmp_path):
    p = plan(["parallel=ddp", "cluster.devices=4", "trainer.micro_batch_size=2", "trainer.global_batch_size=32", "data.seq_len=128"], tmp_path)
    assert p["world_size"] == 4
    assert p["batch"]["accumulate_grad_batches"] == 4  # 32 / (2 x 4)
    assert p["tokens_per_step"] == 32 * 128


def test_cluster_world_size(tmp_path):
    p = plan(["parallel=ddp", "cluster.nodes=4", "cluster.devices=8", "hardware.gpu=A800", "model=tinyllama_1b"], tmp_path)
    assert p["world_size"] == 32 and p["parallel"]["dp"] == 32


def test_resolved_config_shows_derived_values(tmp_path):
    plan(["hardware.gpu=V100"], tmp_path)
    text = (tmp_path / "config_resolved.yaml").read_text()
    assert "vocab_size: 4096" in text and "value: 16-mixed" in text


@needs_llama2
def test_llama2_with_chat_tokens_plans_padded_vocab(tmp_path):
    p = plan(["tokenizer=llama2", '+tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]'], tmp_path)
    assert (p["vocab"]["true"], p["vocab"]["padded"]) == (32002, 32064)
    assert plan(["tokenizer=llama2", "model.vocab_multiple=128", 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]'], tmp_path)["vocab"]["padded"] == 32128


def test_explicit_vocab_below_tokenizer_names_both_numbers(tmp_path):
    with pytest.raises(ConfigError) as e:
        plan(["model.vocab_size=4000"], tmp_path)
    assert "4000" in str(e.value) and "4096" in str(e.value)


def test_explicit_larger_vocab_is_kept(tmp_path):
    p = plan(["model.vocab_size=4160"], tmp_path)
    assert (p["vocab"]["true"], p["vocab"]["padded"]) == (4096, 4160)


def test_all_semantic_problems_reported_together(tmp_path):
    cfg = compose(["mode=plan", "model.num_kv_heads=4", "trainer.warmup_steps=1000", "data.seq_len=5000", "trainer.global_batch_size=7"])
    with pytest.raises(ConfigError) as e:
        run_stages(cfg, tmp_path)
    keys = {p.key for p in e.value.problems}
    assert keys == {"model.num_kv_heads", "trainer.warmup_steps", "data.seq_len", "trainer.global_batch_size"}

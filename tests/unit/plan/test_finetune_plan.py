"""finetune=lora|qlora in the plan: adapter count, trainable rows and per-GPU memory, planned on a
CPU for a 7B base (a config.json is all mode=plan reads)."""

import json

import pytest

from tests.conftest import plan
from tinytrain.plan.memory import GIB

# Llama-2-7B's shape; r=16 on all seven projections is peft's well-known 39,976,960 trainable parameters.
LLAMA2_7B = dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32, vocab_size=4096)


@pytest.fixture(scope="module")
def base_7b(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama2_7b_config")
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "architectures": ["LlamaForCausalLM"], **LLAMA2_7B}))
    return folder


def plan_for(base, tmp_path, *extra) -> dict:
    return plan([f"model.pretrained={base}", "hardware.gpu=A100", "precision=bf16", *extra], tmp_path)


def test_lora_plan_counts_adapters_and_a_frozen_bf16_base(base_7b, tmp_path):
    full = plan_for(base_7b, tmp_path / "full", "preflight.memory=warn")  # a whole 7B's fp32 Adam state does not fit one A100
    lora = plan_for(base_7b, tmp_path / "lora", "finetune=lora")
    ft = lora["finetune"]
    assert full["finetune"] is None
    assert ft["adapter_params"] == ft["trainable_params"] == 39_976_960
    assert ft["trainable_token_ids"] == [] and ft["frozen_dtype"] == "bf16" and ft["base"] == str(base_7b)
    params = lora["params"]["total"]
    m = lora["memory_per_gpu"]
    t = ft["trainable_params"]
    # The frozen base in bf16, 16 bytes per trainable weight (fp32 weight + gradient + Adam moments).
    assert m["params_gib"] == pytest.approx((2 * params + 4 * t) / GIB, abs=1e-3)
    assert m["grads_gib"] == pytest.approx(4 * t / GIB, abs=1e-3) and m["optimizer_gib"] == pytest.approx(8 * t / GIB, abs=1e-3)
    assert m["total_gib"] < full["memory_per_gpu"]["total_gib"] / 4 and lora["memory_per_gpu"]["fits"] and not full["memory_per_gpu"]["fits"]


def test_added_tokens_make_their_rows_trainable(base_7b, tmp_path):
    p = plan_for(base_7b, tmp_path, "finetune=lora", 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]')
    ft = p["finetune"]
    assert ft["trainable_token_ids"] == [4096, 4097]
    assert "2 token(s) added beyond the base's 4096 rows (<|im_start|>, <|im_end|>)" in ft["trainable_tokens_reason"]
    tables = 2 * p["vocab"]["padded"] * 4096  # whole tables take gradients (only those rows keep them)
    assert ft["trainable_params"] == ft["adapter_params"] + tables
    none = plan_for(base_7b, tmp_path / "none", "finetune=lora", 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]', "finetune.trainable_tokens=none")
    assert none["finetune"]["trainable_token_ids"] == [] and none["finetune"]["trainable_params"] == ft["adapter_params"]


def test_lora_under_zero3_partitions_the_base(base_7b, tmp_path):
    p = plan_for(base_7b, tmp_path, "finetune=lora", "parallel=zero3", "cluster.devices=8")
    t, params, m = p["finetune"]["trainable_params"], p["params"]["total"], p["memory_per_gpu"]
    assert m["optimizer_gib"] == pytest.approx(12 * t / 8 / GIB, abs=1e-3)
    assert m["params_gib"] < 2 * params / GIB / 4  # 16-bit weights over 8 ranks plus one gathered layer


def test_qlora_plans_on_a_cpu_with_a_4bit_base(base_7b, tmp_path, capsys):
    lora = plan_for(base_7b, tmp_path / "lora", "finetune=lora")
    q = plan_for(base_7b, tmp_path / "qlora", "finetune=qlora")
    assert q["finetune"]["method"] == "qlora" and q["finetune"]["frozen_dtype"] == "nf4"
    # 6.5B projection weights in NF4 (~0.52 B each) + the bf16 embeddings and fp32 adapters, against ~12.3 GiB in bf16.
    assert 3.0 < q["memory_per_gpu"]["params_gib"] < 3.6 and lora["memory_per_gpu"]["params_gib"] > 12
    assert "finetune   qlora: rank 16, alpha 32" in capsys.readouterr().out


def test_the_tokens_line_of_instruction_data_says_its_rows_are_padded_only_to_their_batch(tmp_path, capsys):
    """Counted as sequences x data.seq_len with no word of it: a smoke alpaca run trained 5,100
    tokens where the line said 8.19k."""
    sft = plan(["data=alpaca", "data.seq_len=256"], tmp_path / "sft")
    assert sft["tokens_padded"] is True
    assert " (sequences x data.seq_len: an upper bound, each batch is padded only to its longest)" in capsys.readouterr().out
    text = plan([], tmp_path / "text")
    assert text["tokens_padded"] is False and "upper bound" not in capsys.readouterr().out

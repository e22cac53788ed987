"""Each preflight check: a setup that triggers it and a healthy one that passes."""

import json

import numpy as np
import pytest
import torch

from tests.conftest import compose, plan, write_untrained_chat_rows_model
from tinytrain.errors import ConfigError
from tinytrain.preflight.checks import special_token_findings

CHAT = 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]'
TINY = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128", "model.max_position_embeddings=256"]


@pytest.fixture(scope="module")
def yi_like(tmp_path_factory):
    """A tiny 'pretrained' Llama whose <|im_start|>/<|im_end|> rows were never trained (~0)."""
    return write_untrained_chat_rows_model(tmp_path_factory.mktemp("yi_like"), TINY)


def test_healthy_setup_passes(tmp_path):
    p = plan([*TINY, CHAT], tmp_path)
    assert p["preflight"] == {"findings": [], "untrained_rows": [], "fix": None}


def test_special_tokens_outside_the_embedding(bundled_tokenizer):
    cfg = compose([])
    found = special_token_findings(cfg, bundled_tokenizer, rows=2)
    assert {f.check for f in found} == {"special_tokens"} and any("'<pad>'" in f.message for f in found)
    assert special_token_findings(cfg, bundled_tokenizer, rows=4096) == []
    assert special_token_findings(compose(["preflight.special_tokens=off"]), bundled_tokenizer, rows=2) == []


def test_vocab_below_tokenizer_stops_or_is_derived_when_relaxed(tmp_path):
    with pytest.raises(ConfigError) as e:
        plan(["model.vocab_size=4000"], tmp_path)
    assert "4000" in str(e.value) and "4096" in str(e.value)
    assert plan(["model.vocab_size=4000", "preflight.vocab=warn"], tmp_path)["vocab"]["padded"] == 4096


def test_untrained_rows_are_fixed_by_default(yi_like, tmp_path):
    p = plan([*TINY, CHAT, f"model.pretrained={yi_like}"], tmp_path)
    assert p["preflight"]["fix"] == "mean"
    assert {r.split(" (")[0] for r in p["preflight"]["untrained_rows"]} == {"'<|im_start|>'", "'<|im_end|>'"}


def test_untrained_rows_policy_error_and_warn(yi_like, tmp_path):
    with pytest.raises(ConfigError) as e:
        plan([*TINY, CHAT, f"model.pretrained={yi_like}", "model.untrained_tokens=error"], tmp_path)
    assert "<|im_start|>" in str(e.value) and "model.untrained_tokens=mean" in str(e.value)
    p = plan([*TINY, CHAT, f"model.pretrained={yi_like}", "model.untrained_tokens=warn"], tmp_path)
    assert [f["check"] for f in p["preflight"]["findings"]] == ["untrained_embeddings"] and p["preflight"]["fix"] is None


def test_fp16_with_untrained_rows_is_a_precision_risk(yi_like, tmp_path):
    with pytest.raises(ConfigError) as e:
        plan([*TINY, CHAT, f"model.pretrained={yi_like}", "model.untrained_tokens=warn", "precision=fp16"], tmp_path)
    assert "[preflight precision_risk]" in str(e.value) and "'<|im_end|>'" in str(e.value) and "bf16" in str(e.value)
    # fixed rows remove the risk
    assert plan([*TINY, CHAT, f"model.pretrained={yi_like}", "precision=fp16"], tmp_path)["preflight"]["fix"] == "mean"


def test_fp16_on_a_fragile_model_warns_only_without_packing(tmp_path):
    unpacked_sft = ["model=tinyllama_1b", "precision=fp16", "data=chat", CHAT]
    p = plan(unpacked_sft, tmp_path)
    assert [f["check"] for f in p["preflight"]["findings"]] == ["precision_risk"]
    finding = p["preflight"]["findings"][0]
    assert "NaN grad_norm" in finding["message"] and finding["fix"].startswith("pack the data (data.pack=true)")
    assert plan([*unpacked_sft, "data.pack=true"], tmp_path)["preflight"]["findings"] == []
    # Pretraining always packs its documents into rows: nothing to warn about.
    assert plan(["model=tinyllama_1b", "precision=fp16"], tmp_path)["preflight"]["findings"] == []
    assert plan([*unpacked_sft, "preflight.precision_risk=off"], tmp_path)["preflight"]["findings"] == []


def test_pretrained_config_vocab_disagreeing_with_weights(yi_like, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(yi_like, broken)
    config = json.loads((broken / "config.json").read_text())
    config["vocab_size"] = 5000
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError) as e:
        plan([*TINY, CHAT, f"model.pretrained={broken}"], tmp_path)
    assert "[preflight pretrained_vocab]" in str(e.value) and "5000" in str(e.value) and "4098" in str(e.value)


def test_seq_len_beyond_pretrained_positions(yi_like, tmp_path):
    with pytest.raises(ConfigError) as e:
        plan([*TINY, CHAT, f"model.pretrained={yi_like}", "data.seq_len=512"], tmp_path)
    assert "[preflight positions]" in str(e.value) and "(256)" in str(e.value)
    assert plan([*TINY, CHAT, f"model.pretrained={yi_like}", "data.seq_len=256"], tmp_path)["batch"]["seq_len"] == 256


def test_data_token_ids_must_be_below_the_vocab(tmp_path, bundled_tokenizer):
    from tests.unit.data.test_token_store import data_cfg, store_for
    from tinytrain.data.store import TokenStore
    from tinytrain.preflight.checks import data_findings

    store, _ = store_for(data_cfg(tmp_path), bundled_tokenizer)
    assert store.meta["max_token_id"] < 4096
    assert data_findings(compose([]), [store], 4096) == []
    # A damaged store (an id past the vocab written into it; no recorded maximum): found by a scan.
    tokens = np.memmap(store.path / "tokens.bin", dtype=np.uint16, mode="r+")
    tokens[5] = 5000
    tokens.flush()
    meta = json.loads((store.path / "meta.json").read_text())
    del meta["max_token_id"]
    (store.path / "meta.json").write_text(json.dumps(meta))
    found = data_findings(compose([]), [TokenStore.open(store.path)], 4096)
    assert [f.check for f in found] == ["data_vocab"] and "token id 5000" in found[0].message
    assert data_findings(compose(["preflight.data_vocab=off"]), [TokenStore.open(store.path)], 4096) == []


def test_fix_rewrites_the_found_rows_on_the_built_model(yi_like, tmp_path):
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.plan.planner import make_plan
    from tinytrain.train.fit import build_module

    cfg = compose([*TINY, CHAT, f"model.pretrained={yi_like}"])
    tok = load_from_config(cfg.tokenizer)
    plan = make_plan(cfg, tok, tmp_path)
    assert plan.preflight.fix == "mean" and {r.token_id for r in plan.preflight.rows_to_fix} == {4096, 4097}
    assert plan.preflight.unfixed_rows == []  # nothing left for the loss-scale guard to name
    model = build_module(cfg, plan, tok).model
    for table in (model.get_input_embeddings().weight, model.get_output_embeddings().weight):
        trained_mean = table[:4096].mean(0)
        torch.testing.assert_close(table[4096], trained_mean, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(table[4097], trained_mean, atol=1e-5, rtol=1e-4)
    assert model.get_input_embeddings().weight.shape[0] == plan.vocab.padded

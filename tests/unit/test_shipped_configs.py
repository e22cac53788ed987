"""Every shipped config composes, validates and plans (in-process, meta-device parameter counts)."""

from pathlib import Path

import pytest

from tests.conftest import CONF_DIR, LLAMA2_TOKENIZER, compose
from tinytrain.cli import run_stages


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def plan(overrides, tmp_path: Path) -> dict:
    cfg = compose(["mode=plan", *overrides])
    return run_stages(cfg, tmp_path)["plan"]


# Analytic counts: embeddings + lm_head (unless tied) + per layer (attention + MLP + 2 norms) + final norm.
def expected_params(h, layers, heads, kv, inter, vocab, tied=False, qkv_bias=False):
    head_dim = h // heads
    attn = h * h + 2 * h * kv * head_dim + h * h + (h + 2 * kv * head_dim if qkv_bias else 0)
    per_layer = attn + 3 * h * inter + 2 * h
    return vocab * h * (1 if tied else 2) + layers * per_layer + h


MODELS = {
    "tiny": (192, 4, 6, 2, 512, False, False),
    "tinyllama_1b": (2048, 22, 32, 4, 5632, False, False),
    "llama2_7b": (4096, 32, 32, 32, 11008, False, False),
    "llama3_8b": (4096, 32, 32, 8, 14336, False, False),
    "yi_6b": (4096, 32, 32, 4, 11008, False, False),
    "qwen2_0_5b": (896, 24, 14, 2, 4864, True, True),
}


def test_every_model_config_is_covered():
    assert set(options("model")) == set(MODELS)


@pytest.mark.parametrize("model", options("model"))
def test_model_plans_with_bundled_tokenizer(model, tmp_path):
    p = plan([f"model={model}"], tmp_path)
    h, layers, heads, kv, inter, tied, bias = MODELS[model]
    assert p["vocab"] == {"true": 4096, "padded": 4096, "multiple": 64, "tp": 1, "padding_rows": 0}
    assert p["params"]["total"] == expected_params(h, layers, heads, kv, inter, 4096, tied, bias)
    assert (tmp_path / "plan.json").exists() and (tmp_path / "config_resolved.yaml").exists()


def test_tinyllama_matches_the_published_size(tmp_path):
    if not LLAMA2_TOKENIZER.exists():
        pytest.skip("../shared/data/llama2-tokenizer absent")
    p = plan(["model=tinyllama_1b", "tokenizer=llama2"], tmp_path)
    assert p["params"]["total"] == 1_100_048_384  # TinyLlama-1.1B's parameter count


@pytest.mark.parametrize(
    "group, option",
    [(g, o) for g in ("tokenizer", "data", "precision", "parallel", "trainer", "logger", "cluster") for o in options(g)],
)
def test_group_option_plans(group, option, tmp_path):
    needs_shared = (group, option) in {("tokenizer", "llama2"), ("data", "text"), ("data", "jsonl"), ("data", "alpaca")}
    if needs_shared and not LLAMA2_TOKENIZER.exists():
        pytest.skip("../shared/data absent")
    extra = ["cluster.devices=2"] if (group, option) in {("parallel", "ddp"), ("parallel", "fsdp_tp")} else []
    if (group, option) == ("precision", "bf16"):
        extra = ["hardware.gpu=A800"]
    if (group, option) == ("data", "chat"):  # ChatML's markers must be special tokens (validate says so)
        extra = ['tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]']
    p = plan([f"{group}={option}", *extra], tmp_path)
    assert p["tokens_per_step"] == p["batch"]["global_batch_size"] * p["batch"]["seq_len"]


@pytest.mark.parametrize("experiment", options("experiment"))
def test_experiment_presets_plan(experiment, tmp_path):
    if experiment == "tinyllama_pretrain" and not LLAMA2_TOKENIZER.exists():
        pytest.skip("../shared/data absent")
    p = plan([f"experiment={experiment}", "hardware.gpu=A800"], tmp_path)
    assert p["precision"]["value"] == "bf16-mixed"
    if experiment == "tinyllama_pretrain":
        assert p["vocab"]["true"] == 32000 and p["batch"]["seq_len"] == 2048

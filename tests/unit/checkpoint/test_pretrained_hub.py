"""model.pretrained as a hub id: read through the Hugging Face hub cache (here a cache folder laid
out as huggingface_hub writes it, offline: no network), and a clear error when the id is not
cached; and the other pretrained/family mistakes a user makes, through the CLI (exit 2, no traceback)."""

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import compose, save_fresh_model
from tests.unit.test_bad_inputs import run_in_process
from tinytrain.cli import run_stages
from tinytrain.errors import ConfigError

TINY = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128", "model.max_position_embeddings=256"]
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty hub cache, offline (huggingface_hub and transformers read both at call time)."""
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    return cache


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, bundled_tokenizer):
    return save_fresh_model(tmp_path_factory.mktemp("saved_model"), TINY, bundled_tokenizer)


def put_in_cache(cache, repo_id: str, folder) -> None:
    """The layout huggingface_hub's downloads leave: refs/main -> a commit, its snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(folder, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)


def test_hub_id_not_cached_is_a_clear_error(hub_cache, tmp_path):
    with pytest.raises(ConfigError) as e:
        run_stages(compose(["mode=plan", *TINY, "model.pretrained=acme/not-cached-7b"]), tmp_path)
    message = str(e.value)
    assert "model.pretrained='acme/not-cached-7b'" in message and "not in the Hugging Face cache" in message
    assert "huggingface-cli download" in message and "no config.json" not in message


def test_hub_id_in_the_cache_plans_and_builds(hub_cache, saved_model, tmp_path, bundled_tokenizer):
    from tinytrain.checkpoint.pretrained import download_weights
    from tinytrain.model.build import build_model, model_config

    put_in_cache(hub_cache, "acme/tiny-llama", saved_model)
    cfg = compose(["mode=plan", *TINY, "model.pretrained=acme/tiny-llama"])
    plan = run_stages(cfg, tmp_path)
    local = run_stages(compose(["mode=plan", *TINY, f"model.pretrained={saved_model}"]), tmp_path / "local")
    assert plan.params == local.params and plan.shape == local.shape
    download_weights("acme/tiny-llama")  # what a training run does first: offline, the cached snapshot serves
    model = build_model(cfg.model, model_config(cfg.model, plan.vocab.padded, bundled_tokenizer), plan.attention)
    weights = load_file(saved_model / "model.safetensors")
    torch.testing.assert_close(model.model.layers[1].mlp.down_proj.weight, weights["model.layers.1.mlp.down_proj.weight"])


@pytest.fixture(scope="module")
def gpt2_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gpt2")
    (folder / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4}))
    return folder


@pytest.mark.parametrize(
    "args, expected",
    [
        (["model.pretrained=acme/not-cached-7b"], ["model.pretrained='acme/not-cached-7b'", "not in the Hugging Face cache", "Fix: download it"]),
        (["model.pretrained={gpt2}"], ["is a 'gpt2' model; tinytrain builds the families llama, qwen2, mistral, gemma2, phi3"]),
        (["model.rope_scaling=8"], ["model.rope_scaling=8", "must be a mapping", "Fix: e.g. model.rope_scaling={rope_type:llama3"]),
        (["model.sliding_window=512"], ["model.sliding_window=512", "model.arch=llama has no sliding-window attention"]),
        (["model=gemma2_2b", "model.attention=sdpa"], ["model.attention='sdpa'", "no SDPA attention for the gemma2 family", "Fix: use model.attention=auto"]),
        (["model=phi3_mini", "model.head_dim=64"], ["model.head_dim=64", "model.arch=phi3 derives it as hidden_size / num_heads (3072 / 32)"]),
        (["model=mistral_7b", "model.attention_bias=true"], ["model.attention_bias=true", "model.arch=mistral has no q/k/v biases"]),
    ],
)
def test_family_and_pretrained_mistakes_exit_2_without_traceback(args, expected, gpt2_folder, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    code, err = run_in_process(["mode=plan", *[a.format(gpt2=gpt2_folder) for a in args], f"hydra.run.dir={tmp_path / 'run'}"])
    assert code == 2 and "Traceback" not in err, err
    for text in expected:
        assert text in err, (text, err)

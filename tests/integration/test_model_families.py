"""Each family preset trains as a tiny variant on CPU (its own transformers class, its family's
keys: sliding window, RoPE scaling, head_dim, biases, tied embeddings) and exports a folder that
class reloads. In-process through the run stages: one import of the training stack for all."""

import json

import pytest

from tests.conftest import compose, logged, run_ranks
from tinytrain.cli import run_stages

pytestmark = pytest.mark.slow

# Each preset's own keys stay; its size shrinks to 2 layers of 64.
TINY = ["model.hidden_size=64", "model.num_layers=2", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128", "model.max_position_embeddings=128"]
RUN = [
    "experiment=smoke",
    "data.seq_len=32",
    "data.tokenize_workers=0",
    "trainer.max_steps=4",
    "trainer.micro_batch_size=2",
    "trainer.lr=1e-2",
    "trainer.warmup_steps=1",
    "trainer.log_every_n_steps=1",
    "trainer.val_every_n_steps=4",
    "trainer.val_batches=1",
    "trainer.checkpoint_every_n_steps=4",
    "trainer.progress_bar=false",
    "trainer.plot=false",
    "generate.sample_prompts=[]",
]
# preset: (overrides that keep the family's features active at this size, class, what its export keeps)
FAMILIES = {
    "mistral_7b": (["model.sliding_window=16"], "MistralForCausalLM", {"sliding_window": 16}),
    "qwen2_5_0_5b": ([], "Qwen2ForCausalLM", {"tie_word_embeddings": True}),
    "qwen2_5_7b": ([], "Qwen2ForCausalLM", {"tie_word_embeddings": False}),
    # Pretrained at 16 positions, stretched x8 by llama3 scaling: seq_len 32 needs it.
    "llama3_1_8b": (["model.rope_scaling.original_max_position_embeddings=16"], "LlamaForCausalLM", {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 16}}),
    # 4 heads of 32 on a hidden size of 64, as Gemma-2-2B's heads are not hidden / heads wide.
    "gemma2_2b": (["model.head_dim=32", "model.sliding_window=16"], "Gemma2ForCausalLM", {"head_dim": 32, "sliding_window": 16}),
    "phi3_mini": (["model.sliding_window=16"], "Phi3ForCausalLM", {"sliding_window": 16}),
    # q/k head norms (heads of 32 on 64, head_dim its own as Qwen3's 128 on 1024).
    "qwen3_0_6b": (["model.head_dim=32"], "Qwen3ForCausalLM", {"head_dim": 32, "tie_word_embeddings": True}),
    # Sliding (window 16, RoPE base 10000) and global layers (base 1e6) alternating; no soft-capping.
    "gemma3_1b": (
        ["model.head_dim=32", "model.sliding_window=16", "model.sliding_window_pattern=2"],
        "Gemma3ForCausalLM",
        {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": 16, "final_logit_softcapping": None, "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}, "full_attention": {"rope_type": "default", "rope_theta": 1000000.0}}},
    ),
}


@pytest.mark.parametrize("preset", sorted(FAMILIES))
def test_family_preset_trains_a_tiny_variant(preset, tmp_path):
    from transformers import AutoModelForCausalLM

    overrides, class_name, kept = FAMILIES[preset]
    run_dir = tmp_path / "run"
    result = run_stages(compose([f"model={preset}", *TINY, *overrides, *RUN]), run_dir)
    losses = logged(run_dir, "loss")
    assert len(losses) == 4 and result["last_loss"] < result["first_loss"]
    config = json.loads((run_dir / "hf_export" / "config.json").read_text())
    assert config["architectures"] == [class_name]
    for key, value in kept.items():
        assert config[key] == value if not isinstance(value, dict) else value.items() <= config[key].items(), key
    model = AutoModelForCausalLM.from_pretrained(run_dir / "hf_export")
    assert type(model).__name__ == class_name
    plan = json.loads((run_dir / "plan.json").read_text())
    assert plan["model"]["attention"] == ("eager" if preset == "gemma2_2b" else "sdpa")


def test_tensor_parallel_shards_other_families_exactly(tmp_path):
    """tp=2 over gloo with the plan read from each built model: the sharded loss equals the
    unsharded one, and so does every gradient (Qwen2's q/k/v biases split with
    their columns; Gemma-2's 4 heads of 32 on 64; Qwen3's and Gemma-3's q/k head norms replicated,
    their gradients summed over the ranks)."""
    presets = ["qwen2_5_7b", "gemma2_2b", "qwen3_8b", "gemma3_1b"]
    run_ranks("tests.integration.tp_families_worker", [str(tmp_path), *presets], 2)
    results = json.loads((tmp_path / "tp_families.json").read_text())
    for preset in presets:
        r = results[preset]
        assert r["loss_tp"] == pytest.approx(r["loss_ref"], abs=1e-5), preset
        assert r["after_step"] < r["loss_tp"], preset
        assert r["max_grad_diff"] < 1e-5, (preset, r["worst_grad"], r["max_grad_diff"])

"""Generation stops at the model's positions (model/generation.py): past them transformers only
warns, and an unbounded generate.max_new_tokens (mode=generate, or a pretrained model's training
samples, which the plan cannot bound) generated until the process was killed."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tinytrain.model.generation import Sampling, generate


def test_a_generation_asked_for_more_than_the_positions_ends_at_them(bundled_tokenizer, caplog):
    config = LlamaConfig(vocab_size=len(bundled_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=24, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    prompt = "def add(a, b):"
    prompt_tokens = len(bundled_tokenizer(prompt)["input_ids"])
    (result,) = generate(model, bundled_tokenizer, [prompt], chat=False, sampling=Sampling(max_new_tokens=10**12), stop_ids=[-1])
    assert result["tokens"] == 24 - prompt_tokens
    assert f"{10**12} new tokens asked after a {prompt_tokens}-token prompt, and the model has 24 positions: {24 - prompt_tokens} generated" in caplog.text
    (within,) = generate(model, bundled_tokenizer, [prompt], chat=False, sampling=Sampling(max_new_tokens=3), stop_ids=[-1])
    assert within["tokens"] == 3


def test_a_rope_scaled_model_generates_as_far_as_its_scaling_reaches():
    """Qwen2.5's config adds YaRN x4 on 32768 without raising max_position_embeddings: capped at
    32768, a 40k-token prompt got an empty completion."""
    from transformers import Qwen2Config

    from tinytrain.model.generation import positions_of, within_positions

    yarn = Qwen2Config(max_position_embeddings=32768, rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    assert positions_of(yarn) == 131072 and within_positions(yarn, 40000, 100) == 100
    assert positions_of(Qwen2Config(max_position_embeddings=32768)) == 32768

import math

import torch

from tinytrain.model.module import causal_lm_loss, param_groups
from tinytrain.plan.schedule import warmup_cosine


def test_padded_vocab_rows_never_contribute_to_the_loss():
    torch.manual_seed(0)
    true_vocab, padded = 10, 16
    logits = torch.randn(2, 5, padded)
    labels = torch.randint(0, true_vocab, (2, 5))
    labels[0, 0] = -100
    base = causal_lm_loss(logits, labels, true_vocab)
    logits[..., true_vocab:] = 1e4  # padding rows that would swallow all probability mass
    assert torch.allclose(causal_lm_loss(logits, labels, true_vocab), base)
    reference = torch.nn.functional.cross_entropy(logits[..., :true_vocab].reshape(-1, true_vocab), labels.reshape(-1), ignore_index=-100)
    assert torch.allclose(base, reference)


def test_warmup_cosine_schedule():
    assert warmup_cosine(0, 10, 100, 0.1) == 0.1
    assert warmup_cosine(9, 10, 100, 0.1) == 1.0
    assert 0.999 < warmup_cosine(10, 10, 100, 0.1) < 1.0  # the decay's first step
    assert math.isclose(warmup_cosine(54, 10, 100, 0.1), 0.55)
    assert math.isclose(warmup_cosine(99, 10, 100, 0.1), 0.1)  # the last trained step
    assert math.isclose(warmup_cosine(500, 10, 100, 0.1), 0.1)


def test_no_weight_decay_on_norms_and_embeddings():
    from transformers import LlamaConfig, LlamaForCausalLM

    model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2))
    decay, no_decay = param_groups(model, 0.1)
    def holds(group, p):
        return any(q is p for q in group["params"])

    assert holds(no_decay, model.model.embed_tokens.weight)
    assert holds(no_decay, model.model.norm.weight)
    assert holds(decay, model.lm_head.weight)
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))

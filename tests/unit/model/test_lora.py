"""finetune=lora on a tiny Llama, with real peft: what trains, what stays the base's, the merge and
peft's adapter folder (tinytrain/model/lora.py, tinytrain/checkpoint/lora_weights.py)."""

from __future__ import annotations

import pytest
import torch

from tinytrain.checkpoint.lora_weights import base_weights, merge_adapters, write_adapter_folder
from tinytrain.model.lora import apply_adapters
from tinytrain.model.module import param_groups
from tinytrain.plan.finetune import FinetunePlan, adapter_parameter_count
from tinytrain.plan.model_shape import ModelShape

SHAPE = ModelShape(hidden=32, layers=2, heads=4, kv_heads=2, intermediate=64, vocab=64, tied_embeddings=False, qkv_bias=False)
TOKEN_ROWS = (60, 61)  # "added" tokens whose rows train with the adapters


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    s = SHAPE
    config = LlamaConfig(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.intermediate, num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads, max_position_embeddings=64, use_cache=False)
    return LlamaForCausalLM(config).eval()


def plan(targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), rows=TOKEN_ROWS) -> FinetunePlan:
    return FinetunePlan("lora", 4, 8.0, 0.0, tuple(targets), adapter_parameter_count(SHAPE, 4, targets), rows, "test", 0, "fp32", "base")


def trained_step(model, lr=1e-2):
    """One AdamW step with weight decay, as the module's optimizer groups it."""
    opt = torch.optim.AdamW(param_groups(model, 0.1, vocab_tables_decay=False), lr=lr)
    ids = torch.randint(0, SHAPE.vocab, (2, 12))
    ids[:, 3] = TOKEN_ROWS[0]
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()


def test_only_adapters_and_the_chosen_rows_train():
    model = tiny_llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    apply_adapters(model, plan())
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in model.named_parameters() if ".lora_" in n} | {"model.embed_tokens.weight", "lm_head.weight"}
    # The plan's analytic count is peft's.
    assert sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n) == plan().adapter_params
    model.train()
    trained_step(model)
    after = base_weights(model.state_dict())
    for name, w in before.items():
        if name in ("model.embed_tokens.weight", "lm_head.weight"):
            others = [i for i in range(SHAPE.vocab) if i not in TOKEN_ROWS]
            assert torch.equal(after[name][others], w[others]), name  # no gradient, no decay: the base's rows
            assert not torch.equal(after[name][list(TOKEN_ROWS)], w[list(TOKEN_ROWS)]), name
        else:
            assert torch.equal(after[name], w), name
    assert all(p.grad is None or p.grad.abs().sum() > 0 for n, p in model.named_parameters() if "lora_B" in n)


def test_without_token_rows_the_tables_are_frozen():
    model = apply_adapters(tiny_llama(), plan(targets=("q_proj", "v_proj"), rows=()))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all(".lora_" in n and (".q_proj." in n or ".v_proj." in n) for n in trainable)


def test_frozen_base_is_held_in_the_compute_dtype():
    model = apply_adapters(tiny_llama(), plan(), frozen_dtype=torch.bfloat16)
    dtypes = {n: p.dtype for n, p in model.named_parameters()}
    assert all(d == torch.float32 for n, d in dtypes.items() if ".lora_" in n or n in ("model.embed_tokens.weight", "lm_head.weight"))
    assert dtypes["model.layers.0.self_attn.q_proj.base_layer.weight"] == torch.bfloat16
    assert dtypes["model.norm.weight"] == torch.bfloat16


def test_merged_weights_and_peft_adapter_folder_compute_what_was_trained(tmp_path):
    from peft import PeftModel
    from transformers import LlamaForCausalLM

    model = apply_adapters(tiny_llama(), plan())
    model.train()
    for _ in range(2):
        trained_step(model, lr=5e-2)  # lora_B leaves zero: the adapters change the output
    model.eval()
    ids = torch.tensor([[1, 5, 60, 61, 9, 33]])
    with torch.no_grad():
        trained = model(input_ids=ids).logits
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    finetune = plan().to_dict()

    merged = LlamaForCausalLM(tiny_llama().config).eval()
    merged.load_state_dict(merge_adapters(state, finetune), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids=ids).logits, trained, rtol=1e-5, atol=1e-5)

    base = tiny_llama()
    base.load_state_dict(base_weights(state), strict=True)
    write_adapter_folder(state, finetune, base, tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    # A user's base: the original weights (rows 60, 61 untrained); the adapter brings the trained rows.
    loaded = PeftModel.from_pretrained(tiny_llama(), tmp_path / "adapter").eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(input_ids=ids).logits, trained, rtol=1e-5, atol=1e-5)


def test_adapters_only_leave_no_empty_optimizer_group():
    """LoRA without trainable token rows has only decayed adapter matrices: one group, not an empty
    second one, which DeepSpeed drops from its optimizer (the schedule then stepped one group too many)."""
    model = apply_adapters(tiny_llama(), plan(rows=()))
    groups = param_groups(model, 0.1, vocab_tables_decay=False)
    assert [g["weight_decay"] for g in groups] == [0.1] and all(".lora_" in n for n, p in model.named_parameters() if p.requires_grad)


def test_default_targets_follow_the_family_phi3_fused_and_gemma2():
    """finetune.target_modules=null: every projection of the family's block gets an adapter (Phi-3's
    fused qkv_proj / gate_up_proj, which Llama's names would miss), and the planned adapter count is
    what peft injects."""
    from transformers import AutoModelForCausalLM

    from tests.conftest import compose
    from tinytrain.model.build import hf_config
    from tinytrain.plan.families import family
    from tinytrain.plan.finetune import targets
    from tinytrain.plan.model_shape import parameter_count, shape_from_config

    tiny = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128", "finetune=lora"]
    for preset, expected in (("phi3_mini", ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")), ("gemma2_2b", ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))):
        cfg = compose([f"model={preset}", *tiny, "model.head_dim=16" if preset == "gemma2_2b" else "model.head_dim=null"])
        chosen = targets(cfg.finetune, family(cfg.model.arch))
        assert chosen == expected
        tok = type("Tok", (), {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0})()
        model = AutoModelForCausalLM.from_config(hf_config(cfg.model, 128, tok))
        shape = shape_from_config(cfg.model, 128)
        assert parameter_count(shape) == sum(p.numel() for p in model.parameters())  # the shape is this model's
        lora = FinetunePlan("lora", 4, 8.0, 0.0, chosen, adapter_parameter_count(shape, 4, chosen), (), "test", 0, "fp32", "base")
        apply_adapters(model, lora)
        adapted = {name.split(".")[-1] for name, m in model.named_modules() if hasattr(m, "lora_A")}
        assert adapted == set(expected)
        assert sum(p.numel() for p in model.parameters() if p.requires_grad) == lora.adapter_params


@pytest.mark.parametrize("local", [True, False])
def test_adapter_config_is_peft_causal_lm_and_portable(tmp_path, local):
    """adapter_config.json as peft writes it for a causal LM (task_type CAUSAL_LM, not null), and its
    base no machine's absolute path: a local base relative to the adapter's final folder (the run
    and its base move together), a hub id as given."""
    import json

    base_dir = tmp_path / "models" / "chat"
    base_dir.mkdir(parents=True)
    finetune = {**plan(rows=()).to_dict(), "base": str(base_dir) if local else "TinyLlama/TinyLlama-1.1B-Chat-v1.0"}
    model = apply_adapters(tiny_llama(), plan(rows=()))
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    base = tiny_llama()
    base.load_state_dict(base_weights(state), strict=True)
    final = tmp_path / "runs" / "r1" / "hf_export" / "adapter"
    write_adapter_folder(state, finetune, base, tmp_path / "staging", final_dir=final)
    config = json.loads((tmp_path / "staging" / "adapter_config.json").read_text())
    assert config["task_type"] == "CAUSAL_LM"
    if local:
        assert config["base_model_name_or_path"] == "../../../../models/chat"
        assert (final / config["base_model_name_or_path"]).resolve() == base_dir.resolve()
    else:
        assert config["base_model_name_or_path"] == "TinyLlama/TinyLlama-1.1B-Chat-v1.0"

"""finetune=lora|qlora on the model: peft's LoRA layers injected in place, the base frozen.

`inject_adapter_in_model` keeps the Hugging Face model class (no PeftModel wrapper), so the
module, the vocab padding, the checkpoints and the strategies see the model they always see; a
projection's weight is renamed `<proj>.base_layer.weight` beside `<proj>.lora_A.default.weight`
and `<proj>.lora_B.default.weight`. Rows of tokens the base never trained (the plan's
`trainable_token_ids`) train too: the embedding and lm_head tables take gradients, and a hook
zeroes every other row's, so those rows stay exactly the base's (Adam moves nothing whose
gradient was always zero, and the tables get no weight decay).
"""

from __future__ import annotations

import logging

import torch

from tinytrain.plan.finetune import FinetunePlan
from tinytrain.preflight.embedding_health import vocab_tables

log = logging.getLogger(__name__)

ADAPTER_NAME = "default"


def lora_config(plan: FinetunePlan, **extra):
    from peft import LoraConfig

    return LoraConfig(r=plan.rank, lora_alpha=plan.alpha, lora_dropout=plan.dropout, target_modules=list(plan.target_modules), bias="none", **extra)


def apply_adapters(model: torch.nn.Module, plan: FinetunePlan, frozen_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Freeze `model`, inject the plan's adapters (fp32, trainable), hold the frozen base in
    `frozen_dtype` (the compute dtype under mixed precision; None leaves it), and let the plan's
    token rows train."""
    from peft import inject_adapter_in_model

    model.requires_grad_(False)
    inject_adapter_in_model(lora_config(plan), model, adapter_name=ADAPTER_NAME)
    for name, p in model.named_parameters():
        is_adapter = ".lora_" in name
        p.requires_grad_(is_adapter)
        if is_adapter:
            p.data = p.data.float()
        elif frozen_dtype is not None and p.is_floating_point():
            p.data = p.data.to(frozen_dtype)
    if plan.trainable_token_ids:
        train_token_rows(model, plan.trainable_token_ids)
    model.train()  # from_pretrained returns eval mode, and Lightning keeps it: the adapters' dropout would be off
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    log.info("%s: %d trainable parameters (adapters on %s%s), %d frozen", plan.method, trainable, ", ".join(plan.target_modules), f"; rows of {len(plan.trainable_token_ids)} token(s) in the vocab tables" if plan.trainable_token_ids else "", sum(p.numel() for p in model.parameters()) - trainable)
    return model


def train_token_rows(model, token_ids) -> None:
    """The vocab tables train, but only in `token_ids`' rows: every other row's gradient is zeroed
    before it is accumulated (so before DeepSpeed's or DDP's reduction sees it)."""
    for weight in vocab_tables(model).values():
        weight.data = weight.data.float()
        weight.requires_grad_(True)
        mask = torch.zeros(weight.shape[0], 1)
        mask[list(token_ids)] = 1.0
        weight.register_hook(lambda grad, mask=mask: grad * mask.to(device=grad.device, dtype=grad.dtype))


def load_quantized_base(model_cfg, padded_vocab: int, attention, compute_dtype: torch.dtype):
    """finetune=qlora: model.pretrained loaded with its projections in 4-bit NF4 (bitsandbytes,
    double quantization, computed in `compute_dtype`) on this process's GPU, resized to the padded
    vocab, and prepared for k-bit training (norms and vocab tables in fp32, input gradients on)."""
    import os

    from peft import prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    from tinytrain.model.build import register

    register(attention)

    quant = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True, bnb_4bit_compute_dtype=compute_dtype)
    device = int(os.environ.get("LOCAL_RANK", 0))  # bitsandbytes quantizes as it loads onto the GPU
    model = AutoModelForCausalLM.from_pretrained(model_cfg.pretrained, quantization_config=quant, dtype=compute_dtype, attn_implementation=attention.implementation, device_map={"": device}, trust_remote_code=model_cfg.trust_remote_code)
    if model.get_input_embeddings().weight.shape[0] != padded_vocab:
        model.resize_token_embeddings(padded_vocab, mean_resizing=True)
    model.config.use_cache = False
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def quantized_prefixes(model) -> list[str]:
    """State-dict prefixes of bitsandbytes' 4-bit layers: a QLoRA checkpoint leaves them out (the
    base is quantized again from model.pretrained, identically, on resume and export)."""
    return [f"{name}." for name, module in model.named_modules() if type(module).__name__ == "Linear4bit"]

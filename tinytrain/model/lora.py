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


def trainable_names(model) -> list[str]:
    return [n for n, p in model.named_parameters() if p.requires_grad]

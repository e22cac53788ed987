"""liger-kernel (the `gpu` extra): Triton kernels for RMSNorm, SwiGLU and RoPE patched into the
Hugging Face model, and a fused linear cross-entropy that computes the loss from hidden states
without materialising the logits. Chosen by tinytrain/plan/fast_paths.py; CUDA only."""

from __future__ import annotations

import torch

from tinytrain.config.schema import Arch


def apply_kernels(model: torch.nn.Module, arch: Arch) -> None:
    """In place on this model instance (RoPE is patched module-wide by liger)."""
    import liger_kernel.transformers

    # apply_liger_kernel_to_llama / _qwen2 / _mistral / _phi3 / _qwen3 / _gemma3_text (Gemma-2 never
    # gets here: fast_paths.py). Gemma-3's MLP is GeGLU, the others' SwiGLU.
    patch = getattr(liger_kernel.transformers, f"apply_liger_kernel_to_{arch.value}")
    mlp = {"geglu": True} if arch == Arch.gemma3_text else {"swiglu": True}
    # Its own loss stays off: tinytrain's loss slices the padded vocab rows away (module.py).
    patch(rope=True, rms_norm=True, **mlp, cross_entropy=False, fused_linear_cross_entropy=False, model=model)


def fused_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, true_vocab: int) -> torch.Tensor:
    """Mean cross-entropy over labelled tokens of hidden @ weight[:true_vocab].T, as causal_lm_loss
    computes it from the logits (padded vocab rows take no probability mass)."""
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    loss = LigerFusedLinearCrossEntropyLoss(ignore_index=-100)(weight[:true_vocab], hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1))
    return loss[0] if isinstance(loss, tuple) else loss

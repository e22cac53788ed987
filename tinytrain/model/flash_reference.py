"""flash-attn 2's and torch varlen's semantics in plain torch, for a CPU.

flash-attn builds only against CUDA, yet the bug that matters (whether packed documents reach the
kernel with their boundaries) lives in the dispatch around it: transformers'
`flash_attention_forward` -> `_flash_attention_forward`, which picks the dense kernel or the varlen
one from the mask, `cu_seq_lens_*` or position ids. `use_reference_flash()` registers an attention
implementation named `REFERENCE` whose kernels are the functions below, so that whole path runs on a
CPU (tests, `benchmarks/gpu_check.sh --dry-run`). `varlen_attn_reference` is torch's
`torch.nn.attention.varlen.varlen_attn` (2.12's signature) in the same terms, and
`varlen_attn_2_10` that kernel behind torch 2.10's signature (`is_causal`, no GQA, no window), for
tinytrain/model/varlen_attention.py's path on a CPU. Never chosen for training.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

REFERENCE = "flash_attention_reference"  # "flash" in the name: transformers treats it as flash-attn


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, softmax_scale, causal: bool, window_size=(-1, -1)) -> torch.Tensor:
    """One sequence: q (Sq, Hq, D), k/v (Sk, Hk, D) -> (Sq, Hq, D). Causal and the window are
    aligned bottom-right (flash-attn >= 2.1): query i sits at key position i + Sk - Sq and sees the
    keys from window_size[0] before it to window_size[1] after it (-1: no bound; causal: 0 after).
    Grouped-query heads share k/v as in the kernel."""
    q, k, v = (x.transpose(0, 1) for x in (q, k, v))
    groups = q.shape[0] // k.shape[0]
    k, v = k.repeat_interleave(groups, dim=0), v.repeat_interleave(groups, dim=0)
    left, right = window_size[0], 0 if causal else window_size[1]
    mask = None
    if left >= 0 or right >= 0:
        sq, sk = q.shape[1], k.shape[1]
        offset = (torch.arange(sk, device=q.device)[None, :] - torch.arange(sq, device=q.device)[:, None]) - (sk - sq)  # key - query position
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device)
        if right >= 0:
            mask &= offset <= right
        if left >= 0:
            mask &= offset >= -left
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=softmax_scale)
    return out.transpose(0, 1)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """Dense kernel: every row of the batch is one sequence (q: batch, seq, heads, dim)."""
    return torch.stack([_attend(q[b], k[b], v[b], softmax_scale, causal, window_size) for b in range(q.shape[0])])


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q=None, max_seqlen_k=None, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False, block_table=None):
    """Varlen kernel: q/k/v are (total tokens, heads, dim); sequence i is [cu[i], cu[i+1])."""
    out = torch.empty_like(q)
    for i in range(len(cu_seqlens_q) - 1):
        qs, qe, ks, ke = int(cu_seqlens_q[i]), int(cu_seqlens_q[i + 1]), int(cu_seqlens_k[i]), int(cu_seqlens_k[i + 1])
        out[qs:qe] = _attend(q[qs:qe], k[ks:ke], v[ks:ke], softmax_scale, causal, window_size)
    return out


def varlen_attn_reference(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None, window_size=(-1, -1), enable_gqa=False):
    """torch.nn.attention.varlen.varlen_attn (torch >= 2.12) in plain torch: (-1, 0) is causal,
    (W - 1, 0) a causal window of W; k/v with fewer heads only with enable_gqa, as torch checks."""
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise RuntimeError(f"varlen_attn: {query.shape[1]} query heads and {key.shape[1]} key heads need enable_gqa=True")
    return flash_attn_varlen_func(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, softmax_scale=scale, window_size=tuple(window_size))


def varlen_attn_2_10(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, is_causal=False, return_aux=None):
    """torch 2.10's varlen_attn signature over the same kernel: causal or not, equal heads, default scale."""
    return varlen_attn_reference(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size=(-1, 0) if is_causal else (-1, -1))


def use_reference_flash() -> str:
    """Register `REFERENCE` with transformers (attention and mask interfaces) and load the kernels
    above into its flash dispatch, as `lazy_import_flash_attention` would load flash-attn's.
    Returns the name to pass as `attn_implementation`."""
    import transformers.modeling_flash_attention_utils as fa
    from transformers import AttentionInterface
    from transformers.integrations.flash_attention import flash_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(REFERENCE, flash_attention_forward)
    AttentionMaskInterface.register(REFERENCE, flash_attention_mask)
    fa._flash_fn, fa._flash_varlen_fn, fa._flash_with_kvcache_fn = flash_attn_func, flash_attn_varlen_func, None
    fa._pad_fn, fa._unpad_fn = fa._pad_input, fa._unpad_input
    fa._process_flash_kwargs_fn = fa._lazy_define_process_function(flash_attn_varlen_func)
    fa._process_with_kvcache_kwargs_fn = dict
    fa._loaded_implementation = REFERENCE
    return REFERENCE

"""model.attention=varlen: torch's own varlen kernel as a transformers attention implementation.

Registered through transformers' AttentionInterface under the name `torch_varlen` (the mask
interface gets transformers' flash mask: None, or the 2-D padding mask, never an S x S one). A packed
batch arrives as one flattened row with `cu_seq_lens_q/k` and `max_length_q/k`
(model/packed_attention.py), each document attending only to itself; a batch without boundaries is
cut into its rows (and, with a padding mask, its real tokens). Causal, grouped-query heads and a
sliding window are asked of the kernel in the form the installed torch takes
(plan/torch_varlen.py): on a torch without `enable_gqa` the k/v heads are repeated per group, on one
without `window_size` the kernel is called with `is_causal` (the plan refuses sliding windows there).
`use_varlen(kernel, support)` registers another kernel under another name: on a CPU the tests run
this whole path with tinytrain/model/flash_reference.py's pure-torch kernel.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tinytrain.plan.attention import TORCH_VARLEN
from tinytrain.plan.torch_varlen import VarlenSupport, installed_support, varlen_function


def attend(kernel, support: VarlenSupport, q, k, v, cu_q, cu_k, max_q: int, max_k: int, scale: float | None, sliding_window: int | None) -> torch.Tensor:
    """Causal attention of each sequence [cu[i], cu[i+1]) to itself: q (Tq, Hq, D), k/v (Tk, Hk, D)."""
    options = {}
    if k.shape[1] != q.shape[1]:
        if support.gqa:
            options["enable_gqa"] = True
        else:
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if support.window:
        # (left, right) in flash-attn's sense, right 0 = causal: a window of W tokens counts the query's own.
        options["window_size"] = (sliding_window - 1 if sliding_window else -1, 0)
    elif sliding_window:
        raise ValueError(f"torch {support.torch_version}'s varlen_attn takes no window_size: it cannot run a sliding window of {sliding_window} (model.attention=auto picks another kernel)")
    else:
        options["is_causal"] = True
    if scale is not None:
        if support.scale:
            options["scale"] = scale
        elif abs(scale - q.shape[-1] ** -0.5) > 1e-9:
            raise ValueError(f"torch {support.torch_version}'s varlen_attn takes no scale: it cannot run a softmax scale of {scale}")
    return kernel(q, k, v, cu_q, cu_k, int(max_q), int(max_k), **options)


def _cumulative(lengths: torch.Tensor) -> torch.Tensor:
    return F.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)


def varlen_forward(kernel, support: VarlenSupport):
    """An AttentionInterface function (query/key/value (B, H, S, D) -> output (B, S, H, D)) on `kernel`."""

    def forward(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, sliding_window: int | None = None, softcap: float | None = None, **kwargs):
        if softcap:
            raise ValueError("torch's varlen_attn has no attention soft-capping (model.attention=auto picks flash-attn 2 or eager)")
        if dropout and module.training:
            raise ValueError(f"torch's varlen_attn has no attention dropout ({dropout}): set the model's attention_dropout to 0")
        b, hq, sq, d = query.shape
        hk, sk = key.shape[1], key.shape[2]
        # Under autocast the projections come out in half precision but RoPE's float32 cos/sin
        # promote q and k back to float32, and the flash kernel takes fp16/bf16 only (autocast does
        # not know this custom op). v has no RoPE: it carries the projection's precision, so q and k
        # take its dtype. No autocast query: torch 2.11's dynamo breaks the graph on one.
        # (B, S, H, D) in memory, as transformers' flash path lays them out for the kernel
        q, k, v = (x.transpose(1, 2).to(value.dtype).contiguous() for x in (query, key, value))

        def run(q_, k_, v_, cu_q, cu_k, max_q, max_k):
            return attend(kernel, support, q_, k_, v_, cu_q, cu_k, max_q, max_k, scaling, sliding_window)

        boundaries = kwargs.get("cu_seq_lens_q")
        if boundaries is not None:  # a packed batch, flattened to one row by the module
            out = run(q.reshape(-1, hq, d), k.reshape(-1, hk, d), v.reshape(-1, hk, d), boundaries, kwargs["cu_seq_lens_k"], kwargs["max_length_q"], kwargs["max_length_k"])
            return out.view(b, sq, hq, d), None
        if attention_mask is None:  # every row whole (queries are the last sq of sk keys when decoding)
            rows = torch.arange(b + 1, device=q.device, dtype=torch.int32)
            out = run(q.reshape(-1, hq, d), k.reshape(-1, hk, d), v.reshape(-1, hk, d), rows * sq, rows * sk, sq, sk)
            return out.view(b, sq, hq, d), None
        # A 2-D padding mask over the keys: only the real tokens go in, padding rows come back zero.
        keep_k = attention_mask.bool()
        keep_q = keep_k[:, -sq:]
        len_q, len_k = keep_q.sum(1), keep_k.sum(1)
        real = run(q[keep_q], k[keep_k], v[keep_k], _cumulative(len_q), _cumulative(len_k), int(len_q.max()), int(len_k.max()))
        out = q.new_zeros(b, sq, hq, d)
        out[keep_q] = real
        return out, None

    return forward


def use_varlen(kernel, support: VarlenSupport, name: str) -> str:
    """Register `kernel` with transformers as attention implementation `name`; returns `name`."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, flash_attention_mask

    AttentionInterface.register(name, varlen_forward(kernel, support))
    AttentionMaskInterface.register(name, flash_attention_mask)
    return name


def use_torch_varlen() -> str:
    """The installed torch's varlen_attn as `torch_varlen` (what model.attention=varlen builds)."""
    support = installed_support()
    if not support.available:
        raise ImportError(support.gap(False, False))
    return use_varlen(varlen_function(), support, TORCH_VARLEN)

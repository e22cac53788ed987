"""Gradient norm and clipping that work for plain tensors and DTensors on several meshes.

Under fsdp_tp the projections live on the (dp, tp) mesh and the norms' weights on the dp mesh
alone; torch's clip_grad_norm_ cannot stack norms from different meshes, so the total is
combined per mesh here.
"""

from __future__ import annotations

import torch


def total_grad_norm(parameters) -> torch.Tensor:
    groups: dict[object, list[torch.Tensor]] = {}
    for p in parameters:
        if p.grad is not None:
            groups.setdefault(getattr(p.grad, "device_mesh", None), []).append(p.grad)
    norms = []
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
        norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if not norms:
        return torch.tensor(0.0)
    return torch.linalg.vector_norm(torch.stack(norms))


def clip_grad_norm(parameters, max_norm: float, total: torch.Tensor | None = None) -> torch.Tensor:
    """Scale gradients so their total norm is at most max_norm; returns the pre-clip norm.
    `total`: the norm already measured this step (the non-finite guard's pass), if any."""
    parameters = [p for p in parameters if p.grad is not None]
    if total is None:
        total = total_grad_norm(parameters)
    if max_norm != float("inf"):
        scale = float(torch.clamp(max_norm / (total + 1e-6), max=1.0))
        if scale < 1.0:
            for p in parameters:
                p.grad.mul_(scale)
    return total

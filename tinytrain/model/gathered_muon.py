"""torch.optim.Muon's update for weights held as DTensor shards (parallel=fsdp_tp), and with its
Newton-Schulz iteration in fp32 where training runs in fp32.

Newton-Schulz orthogonalises a whole matrix, and a rank of FSDP2 x TP holds a shard of each.
torch 2.13's Muon does run on DTensors, but each of its matmuls then goes through DTensor's
sharding rules (collectives inside every iteration, bf16 partial sums reduced across ranks): a
(7, 5) matrix sharded by rows came out 1.7e-3 away from the one-rank update (checked on gloo).
Here the momentum stays a shard (its update is elementwise, so local), one all-gather per matrix
per step brings the Nesterov update whole to every rank, Newton-Schulz runs on it as on one rank,
and each rank keeps its shard of the result (a local slice, no second collective). Memory: the
momentum is 1/(dp x tp) of each matrix per rank; the transient is one whole matrix at a time.

torch's iteration always runs in bf16. Under 32-true (CPU) it runs here in fp32, as DeepSpeed's
does off an accelerator: bf16 rounds away the last bits in which the ranks' reduced gradients
differ from one process's, and then moves the weights apart by bf16's 4e-3, not fp32's 1e-7.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Replicate
from torch.optim._muon import _adjust_lr  # torch.optim.Muon's rate adjustment (match_rms_adamw)


def newton_schulz(g: torch.Tensor, coefficients, steps: int, eps: float, dtype: torch.dtype) -> torch.Tensor:
    """torch's `_zeropower_via_newtonschulz` (torch/optim/_muon.py, op for op) in `dtype`: bf16
    gives torch's result to the bit (tests/unit/model/test_optimizers.py)."""
    a, b, c = coefficients
    x = g.to(dtype, copy=True)  # torch's bfloat16() copies an fp32 input; the input must stay (a momentum buffer)
    if g.size(0) > g.size(1):
        x = x.T
    x.div_(x.norm().clamp(min=eps))  # spectral norm at most 1
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if g.size(0) > g.size(1) else x


def local_update(update: DTensor, orthogonalise) -> DTensor:
    """`orthogonalise` applied to the whole matrix of a sharded `update`, as a shard like it."""
    whole = orthogonalise(update.full_tensor())
    replicated = DTensor.from_local(whole, update.device_mesh, [Replicate()] * update.device_mesh.ndim, run_check=False)
    return replicated.redistribute(update.device_mesh, update.placements)  # Replicate -> Shard slices locally


class GatheredMuon(torch.optim.Muon):
    """torch.optim.Muon (same groups, options and state names) stepping DTensor shards, with
    Newton-Schulz in `ns_dtype`."""

    def __init__(self, params, *, ns_dtype: torch.dtype = torch.bfloat16, **options):
        super().__init__(params, **options)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]

            def orthogonalise(x, group=group):
                return newton_schulz(x, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)

            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad, memory_format=torch.preserve_format)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)  # torch's Muon, line for line (_single_tensor_muon)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = local_update(update, orthogonalise) if isinstance(update, DTensor) else orthogonalise(update)
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update, alpha=-_adjust_lr(lr, group["adjust_lr_fn"], p.shape))  # p.shape: the whole matrix's
        return loss

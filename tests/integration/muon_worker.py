"""One rank of a 2-process check of GatheredMuon on DTensor shards (gloo, CPU).

Usage: RANK=r WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python -m tests.integration.muon_worker OUT_FILE
Matrices sharded by rows and by columns over a mesh of 2, their sizes not divisible by 2 (uneven
shards), step three times with the same gradients as whole tensors under torch.optim.Muon in one
process; rank 0 writes, per Newton-Schulz dtype, the largest difference of the gathered weights from
the whole ones.
"""

import json
import os
import sys

from benchmarks.rank_exit import end_rank


def main(out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from tinytrain.model.gathered_muon import GatheredMuon

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,))
    options = {"lr": 0.05, "weight_decay": 0.1, "momentum": 0.95, "nesterov": True, "adjust_lr_fn": "match_rms_adamw"}
    g = torch.Generator().manual_seed(0)
    shapes = [((7, 5), Shard(0)), ((7, 5), Shard(1)), ((5, 9), Shard(0))]
    weights = [torch.randn(shape, generator=g) for shape, _ in shapes]
    grads = [[torch.randn(shape, generator=g) for shape, _ in shapes] for _ in range(3)]
    result = {}
    for name, dtype in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        whole = [torch.nn.Parameter(w.clone()) for w in weights]
        sharded = [torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [placement])) for w, (_, placement) in zip(weights, shapes)]
        reference = torch.optim.Muon(whole, **options) if dtype is torch.bfloat16 else GatheredMuon(whole, ns_dtype=dtype, **options)
        ours = GatheredMuon(sharded, ns_dtype=dtype, **options)
        for step in grads:
            for p, q, grad in zip(whole, sharded, step):
                p.grad = grad.clone()
                q.grad = distribute_tensor(grad.clone(), mesh, q.placements)
            reference.step()
            ours.step()
        result[name] = max(float((p.detach() - q.detach().full_tensor()).abs().max()) for p, q in zip(whole, sharded))
        result[f"{name} placements kept"] = all(q.placements == (placement,) for q, (_, placement) in zip(sharded, shapes))
        result[f"{name} momentum sharded"] = all(ours.state[q]["momentum_buffer"].placements == q.placements for q in sharded)
    if dist.get_rank() == 0:
        with open(out, "w") as f:
            json.dump(result, f)
    end_rank()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main(sys.argv[1])

"""One rank of a ring (torch context parallel, flex path) check: tinytrain's model/ring_attention.py
on a dp x cp x tp mesh against the same model with whole sequences.

Usage: RANK=r WORLD_SIZE=w MASTER_ADDR=... MASTER_PORT=... python -m tests.integration.ring_worker CP OUT_DIR [TP [OVERRIDES]]

OVERRIDES: model keys beside cp_worker's MODEL, comma-separated (a family with sliding-window layers).

With TP > 1 the ring model's projections are also split by tinytrain's tensor-parallel plan
(model/tensor_parallel.py) on the mesh's tp dimension, and its gradients are gathered whole.

Each data-parallel group trains its own packed batch (cp_worker.packed_batch: documents of several
lengths, position ids restarting per document); every rank takes torch's load-balanced share of it
and the group's mean loss. Rank 0 saves each rank's loss and gathered logits against the whole
sequences', and every gradient, averaged over the ranks as FSDP does over dp x cp, against the
whole-sequence mean over the groups. The kernel is the run's: SDPA over the block mask on CPU (flex
attention has no CPU backward), compiled flex attention on GPUs (one per rank, nccl).
"""

import contextlib
import os
import sys
from pathlib import Path

from benchmarks.rank_exit import end_rank
from tests.integration.cp_worker import MODEL, packed_batch

# torch's cp block mask needs the sequence to be a multiple of cp x 128 (its block size).
SEQ = 256


def main(cp: int, out_dir: Path, tp: int = 1, overrides: tuple[str, ...] = ()) -> None:
    import torch
    import torch.distributed as dist

    from tests.conftest import compose
    from tests.host_reads import HostReads
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import build_model, hf_config
    from tinytrain.model.module import causal_lm_loss
    from tinytrain.model.ring_attention import build_mesh, enable_ring
    from tinytrain.model.tensor_parallel import tp_plan
    from tinytrain.plan.attention import AttentionChoice

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    gpus = torch.cuda.device_count()
    device = torch.device("cuda", rank % gpus) if gpus else torch.device("cpu")
    if gpus:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if gpus >= world else "gloo", rank=rank, world_size=world)
    cfg = compose([*MODEL, *overrides])
    tok = load_from_config(cfg.tokenizer)
    vocab = len(tok)
    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(build_model(cfg.model, hf_config(cfg.model, vocab, tok), AttentionChoice("sdpa", "test")).to(device))
    reference, model = models
    groups = world // (cp * tp)

    whole, whole_logits = [], []
    for g in range(groups):
        batch = {k: v.to(device) for k, v in packed_batch(g, vocab, SEQ)[0].items()}
        logits = reference(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        loss = causal_lm_loss(logits, batch["labels"], vocab)
        (loss / groups).backward()
        whole.append(float(loss))
        whole_logits.append(logits.detach())

    mesh = build_mesh(device.type, world, cp=cp, tp=tp)
    if tp > 1:
        from torch.distributed.tensor.parallel import parallelize_module

        parallelize_module(model, mesh["tp"], tp_plan(model))
    ring = enable_ring(model, mesh["cp"])
    group = rank // (cp * tp)  # the sampler's dp rank
    batch = {k: v.to(device) for k, v in packed_batch(group, vocab, SEQ)[0].items()}
    local = ring.shard(batch)
    # The host reads of the forward and the group's loss, on a CPU: a GPU's compiled flex attention
    # refuses to trace under a dispatch mode (and so does the shard's block mask, left out).
    reads = HostReads() if device.type == "cpu" else contextlib.nullcontext()
    with reads:
        inputs = {"input_ids": local["input_ids"], "position_ids": local["position_ids"], "attention_mask": local["attention_mask"], "use_cache": False}
        logits = model(**inputs).logits
        loss = ring.mean_loss(causal_lm_loss(logits, local["labels"], vocab), local["labels"])
    # Every token's logits, gathered back into order: stricter than the loss (a random model's loss barely moves).
    want = whole_logits[group]
    logits_gap = float((ring.unshard(logits.detach()) - want).abs().max() / want.abs().max())
    result = {"loss_gap": abs(float(loss) - whole[group]) / whole[group], "logits_gap": logits_gap, "local_tokens": int(local["input_ids"].shape[1])}
    result["host_reads"] = len(reads.ops) if isinstance(reads, HostReads) else None
    loss.backward()
    worst, compared = 0.0, 0
    for p, q in zip(model.parameters(), reference.parameters(), strict=True):
        # Whole on every tp rank, then the mean over the world: over dp x cp, as FSDP takes it.
        grad = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()
        dist.all_reduce(grad)
        grad /= world
        worst = max(worst, float((grad - q.grad).norm() / q.grad.norm().clamp(min=1e-12)))
        compared += 1
    result.update(grad_gap=worst, grads_compared=compared)
    gaps = [None] * world
    dist.all_gather_object(gaps, result)
    if rank == 0:
        torch.save({"ranks": gaps, "device": device.type}, out_dir / f"ring_cp{cp}_tp{tp}_world{world}{'_' + cfg.model.arch.value if overrides else ''}.pt")
    end_rank()


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else 1, tuple(sys.argv[4].split(",")) if len(sys.argv) > 4 else ())

"""One rank of a context-parallel check over gloo (CPU): DeepSpeed's Ulysses through tinytrain's
model/context_parallel.py against the same model with whole sequences, gradient by gradient.

Usage: RANK=r WORLD_SIZE=w MASTER_ADDR=... MASTER_PORT=... python -m tests.integration.cp_worker CP OUT_DIR

Each data-parallel group (cp consecutive ranks) trains its own packed batch (documents of several
lengths per row, position ids restarting per document); every rank splits it with ContextGroup,
takes the group's mean loss and backpropagates through Ulysses' all-to-alls; the gradients are
then averaged over all ranks, as DeepSpeed's engine does. Rank 0 saves, for every parameter, the
relative difference to the reference: the mean over the groups of each batch's gradient with
whole sequences, and the loss of each packed batch against its documents run one by one.
"""

import os
import sys
from pathlib import Path

from benchmarks.rank_exit import end_rank

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
SEQ = 64
ROWS = 2


def packed_batch(group: int, vocab: int, seq: int = SEQ):
    """ROWS rows of `seq` tokens, each row documents of random lengths; labels pre-shifted (the next
    token of the same document, -100 on each document's last token), as the data stage makes them."""
    import torch

    g = torch.Generator().manual_seed(100 + group)
    ids = torch.randint(0, vocab, (ROWS, seq), generator=g)
    positions = torch.empty(ROWS, seq, dtype=torch.long)
    labels = torch.full((ROWS, seq), -100, dtype=torch.long)
    documents = []
    for row in range(ROWS):
        start = 0
        while start < seq:
            n = min(int(torch.randint(5, 30, (1,), generator=g)), seq - start)
            positions[row, start : start + n] = torch.arange(n)
            labels[row, start : start + n - 1] = ids[row, start + 1 : start + n]
            documents.append((row, start, n))
            start += n
    return {"input_ids": ids, "position_ids": positions, "labels": labels}, documents


def main(cp: int, out_dir: Path) -> None:
    import torch
    import torch.distributed as dist

    from tests.conftest import compose
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import build_model, hf_config
    from tinytrain.model.context_parallel import enable_ulysses
    from tinytrain.model.module import causal_lm_loss
    from tinytrain.plan.attention import AttentionChoice

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)  # deepspeed.comm: enable_ulysses starts it over this, as under fsdp_tp
    cfg = compose(MODEL)
    tok = load_from_config(cfg.tokenizer)
    vocab = len(tok)
    torch.manual_seed(0)
    reference = build_model(cfg.model, hf_config(cfg.model, vocab, tok), AttentionChoice("sdpa", "test"))
    torch.manual_seed(0)
    model = build_model(cfg.model, hf_config(cfg.model, vocab, tok), AttentionChoice("sdpa", "test"))
    groups = world // cp

    # The reference: whole sequences, SDPA masking documents apart from the position ids (cp=1's path).
    loss_gap = 0.0
    for g in range(groups):
        batch, documents = packed_batch(g, vocab)
        logits = reference(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        loss = causal_lm_loss(logits, batch["labels"], vocab)
        (loss / groups).backward()
        # The packed loss against each document alone (token-weighted), the isolation check.
        total, count = 0.0, 0
        with torch.no_grad():
            for row, start, n in documents:
                alone = reference(input_ids=batch["input_ids"][row : row + 1, start : start + n], use_cache=False).logits
                labels = batch["labels"][row : row + 1, start : start + n]
                k = int((labels != -100).sum())
                if k:
                    total += float(causal_lm_loss(alone, labels, vocab)) * k
                    count += k
        loss_gap = max(loss_gap, abs(total / count - float(loss)) / float(loss))

    context = enable_ulysses(model, cp=cp, micro_batch_size=ROWS)
    batch, _ = packed_batch(rank // cp, vocab)  # the sampler's data-parallel rank
    local = context.shard(batch)
    out = model(input_ids=local["input_ids"], position_ids=local["position_ids"], use_cache=False).logits
    loss = context.mean_loss(causal_lm_loss(out, local["labels"], vocab), local["labels"])
    loss.backward()
    worst = 0.0
    worst_name = ""
    for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters(), strict=True):
        grad = p.grad.clone()
        dist.all_reduce(grad)  # DeepSpeed's data-parallel average over every rank
        grad /= world
        gap = float((grad - q.grad).norm() / q.grad.norm().clamp(min=1e-12))
        if gap > worst:
            worst, worst_name = gap, name
    losses = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(losses, loss.detach().reshape(1))
    if rank == 0:
        torch.save({"grad_gap": worst, "grad_gap_param": worst_name, "packed_vs_alone": loss_gap, "group_losses": [float(x) for x in losses], "params": len(list(model.parameters()))}, out_dir / f"cp{cp}_world{world}.pt")
    end_rank()


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]))

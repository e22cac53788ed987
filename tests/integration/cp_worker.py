"""One rank of a context-parallel check over gloo (CPU): DeepSpeed's Ulysses through tinytrain's
model/context_parallel.py against the same model with whole sequences, gradient by gradient.

Usage: RANK=r WORLD_SIZE=w MASTER_ADDR=... MASTER_PORT=... python -m tests.integration.cp_worker CP OUT_DIR [ATTENTION]

ATTENTION is the kernel Ulysses wraps: sdpa (default), varlen (torch's varlen kernel's signature)
or flash (transformers' flash-attn path), the last two over flash_reference.py's pure-torch kernel.

Each data-parallel group (cp consecutive ranks) trains its own packed batch (documents of several
lengths per row, position ids restarting per document); every rank splits it with ContextGroup,
runs the training forward's inputs (the whole rows' boundaries with the slice), takes the group's
mean loss and backpropagates through Ulysses' all-to-alls; the gradients are then averaged over all
ranks, as DeepSpeed's engine does. Rank 0 saves, for every parameter, the relative difference to
the reference: the mean over the groups of each batch's gradient with whole sequences, and the loss
of each packed batch against its documents run one by one; and the ops of its forward and loss that
read a value to the host (a device sync each on a GPU), beside cp=1's on the same kernel.
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


def core_attention(attention: str) -> str:
    """The implementation name of the kernel Ulysses wraps (the stand-ins registered with transformers)."""
    from tinytrain.model.flash_reference import use_reference_flash, varlen_attn_reference
    from tinytrain.model.varlen_attention import use_varlen
    from tinytrain.plan.torch_varlen import read_support

    if attention == "varlen":
        return use_varlen(varlen_attn_reference, read_support(varlen_attn_reference, "2.12"), "torch_varlen_reference")
    if attention == "flash":
        return use_reference_flash()
    return "sdpa"


def main(cp: int, out_dir: Path, attention: str = "sdpa") -> None:
    import torch
    import torch.distributed as dist

    from tests.conftest import compose
    from tests.host_reads import HostReads
    from tinytrain.data.collate import with_document_boundaries
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import build_model, hf_config
    from tinytrain.model.context_parallel import enable_ulysses
    from tinytrain.model.module import MODEL_INPUTS, CausalLMModule, causal_lm_loss
    from tinytrain.model.module_spec import ModuleSpec
    from tinytrain.plan.attention import AttentionChoice

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)  # deepspeed.comm: enable_ulysses starts it over this, as under fsdp_tp
    cfg = compose(MODEL)
    tok = load_from_config(cfg.tokenizer)
    vocab = len(tok)
    torch.manual_seed(0)
    reference = build_model(cfg.model, hf_config(cfg.model, vocab, tok), AttentionChoice("sdpa", "test"))
    torch.manual_seed(0)
    model = build_model(cfg.model, hf_config(cfg.model, vocab, tok), AttentionChoice(core_attention(attention), "test"))
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

    batch, _ = packed_batch(rank // cp, vocab)  # the sampler's data-parallel rank
    batch = with_document_boundaries(batch)  # as the collator gives it
    with torch.no_grad(), HostReads() as cp1_reads:  # cp=1's training forward and loss on the same kernel
        logits = model(**CausalLMModule(model, ModuleSpec(vocab)).model_kwargs(**{k: batch[k] for k in MODEL_INPUTS if k in batch})).logits
        causal_lm_loss(logits.view(*batch["input_ids"].shape, -1), batch["labels"], vocab)
    context = enable_ulysses(model, cp=cp, micro_batch_size=ROWS)
    local = context.shard(batch)
    with HostReads() as reads:  # the forward and the group's mean loss
        out = model(**context.model_kwargs(**local)).logits
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
        result = {"grad_gap": worst, "grad_gap_param": worst_name, "packed_vs_alone": loss_gap, "group_losses": [float(x) for x in losses], "params": len(list(model.parameters()))}
        result.update(host_reads=len(reads.ops), cp1_host_reads=len(cp1_reads.ops), attention=model.config._attn_implementation)
        torch.save(result, out_dir / f"cp{cp}_world{world}_{attention}.pt")
    end_rank()


if __name__ == "__main__":
    main(int(sys.argv[1]), Path(sys.argv[2]), *sys.argv[3:])

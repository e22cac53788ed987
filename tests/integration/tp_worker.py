"""One rank of a 2-process tensor-parallel check (gloo, CPU).

Usage: RANK=r WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python -m tests.integration.tp_worker OUT_DIR
Builds a tiny Llama whose tokenizer has an odd length (4097), shards it with tinytrain's
tensor_parallel.parallelize (tp=2), compares its loss with the unsharded model's, trains a few
steps, and saves (rank 0) the logits on a fixed batch plus a checkpoint made the tinytrain way
(gather full tensors, then unpad) and the rows a shard-first unpad would have kept.
"""

import copy
import os
import sys
from pathlib import Path

from benchmarks.rank_exit import end_rank

ODD_TOKEN = "<|odd|>"
MODEL_OVERRIDES = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=4", "model.intermediate_size=128"]


def fixed_batch(true_vocab: int):
    import torch

    g = torch.Generator().manual_seed(7)
    batch = torch.randint(0, true_vocab, (2, 17), generator=g)
    batch[0, 3] = true_vocab - 1  # the added token, which lives in the last real row
    return batch[:, :-1], batch[:, 1:]


def main(out_dir: Path) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )
    from torch.distributed.device_mesh import init_device_mesh

    from tests.conftest import compose
    from tinytrain.checkpoint.format import unpad_vocab, vocab_param_names
    from tinytrain.data.tokenizer import fingerprint, load_from_config
    from tinytrain.model.build import build_model, hf_config
    from tinytrain.model.module import causal_lm_loss
    from tinytrain.model.tensor_parallel import parallelize
    from tinytrain.plan.attention import AttentionChoice
    from tinytrain.plan.start_points import checkpoint_metadata
    from tinytrain.plan.vocab import plan_vocab

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    cfg = compose([*MODEL_OVERRIDES, f'tokenizer.add_special_tokens=["{ODD_TOKEN}"]'])
    tok = load_from_config(cfg.tokenizer)
    n = len(tok)
    vocab = plan_vocab(n, cfg.model.vocab_multiple, world)
    torch.manual_seed(0)
    model = build_model(cfg.model, hf_config(cfg.model, vocab.padded, tok), AttentionChoice("sdpa", "test"))
    reference = copy.deepcopy(model)
    names = vocab_param_names(reference)
    mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("data_parallel", "tensor_parallel"))
    parallelize(model, mesh)

    inputs, labels = fixed_batch(n)
    loss_tp = causal_lm_loss(model(input_ids=inputs).logits, labels, n)
    loss_ref = causal_lm_loss(reference(input_ids=inputs).logits, labels, n)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(4):
        loss = causal_lm_loss(model(input_ids=inputs).logits, labels, n)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    with torch.no_grad():
        logits = model(input_ids=inputs).logits[..., :n].clone()

    # The wrong order: trim each rank's shard of the padded table to its share, then gather.
    local = model.model.embed_tokens.weight.to_local().detach()
    shares = [torch.empty_like(local[: n // world]) for _ in range(world)]
    dist.all_gather(shares, local[: n // world].contiguous())

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        unpad_vocab(full, names, n)  # after the gather
        checkpoint = {"state_dict": {f"model.{k}": v for k, v in full.items()}, "tinytrain": checkpoint_metadata(vocab, fingerprint(tok), "tp-test")}
        torch.save(checkpoint, out_dir / "tp2.ckpt")
        torch.save(
            {"loss_tp": loss_tp.item(), "loss_ref": loss_ref.item(), "losses": losses, "logits": logits, "shard_first_rows": torch.cat(shares), "padded": vocab.padded},
            out_dir / "tp2_result.pt",
        )
    end_rank()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

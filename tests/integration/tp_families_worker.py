"""One rank of a 2-process tensor-parallel check of other families than Llama (gloo, CPU).

Usage: RANK=r WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python -m tests.integration.tp_families_worker OUT_DIR PRESET...
For each preset, builds its tiny untied variant, shards it with tinytrain's tensor_parallel.parallelize
(tp=2; the layer plan read from the built model) and writes (rank 0) its loss next to the unsharded
model's on the same batch, the largest difference of any gradient from the unsharded model's (a
gradient that should have been summed over the ranks, such as a q/k head norm's, would show), and
the loss after one optimizer step.
"""

import copy
import json
import os
import sys
from pathlib import Path

from benchmarks.rank_exit import end_rank

TINY = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128", "model.tie_word_embeddings=false"]
PRESET_OVERRIDES = {
    "gemma2_2b": ["model.head_dim=32", "model.sliding_window=8"],
    "mistral_7b": ["model.sliding_window=8"],
    # Gemma-3's sliding and global layers both (pattern 2), heads of 32 on 64.
    "gemma3_1b": ["model.head_dim=32", "model.sliding_window=8", "model.sliding_window_pattern=2"],
    "qwen3_8b": ["model.head_dim=32"],
}


def full(tensor):
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def main(out_dir: Path, presets: list[str]) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from tests.conftest import compose
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import build_model, hf_config
    from tinytrain.model.module import causal_lm_loss
    from tinytrain.model.tensor_parallel import parallelize
    from tinytrain.plan.attention import AttentionChoice
    from tinytrain.plan.vocab import plan_vocab

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=rank, world_size=world)
    results = {}
    for preset in presets:
        cfg = compose([f"model={preset}", *TINY, *PRESET_OVERRIDES.get(preset, [])])
        tok = load_from_config(cfg.tokenizer)
        n = len(tok)
        vocab = plan_vocab(n, cfg.model.vocab_multiple, world)
        torch.manual_seed(0)
        attention = "eager" if preset == "gemma2_2b" else "sdpa"
        model = build_model(cfg.model, hf_config(cfg.model, vocab.padded, tok), AttentionChoice(attention, "test"))
        reference = copy.deepcopy(model)
        parallelize(model, init_device_mesh("cpu", (1, world), mesh_dim_names=("data_parallel", "tensor_parallel")))
        batch = torch.randint(0, n, (2, 17), generator=torch.Generator().manual_seed(7))
        inputs, labels = batch[:, :-1], batch[:, 1:]
        loss_tp = causal_lm_loss(model(input_ids=inputs).logits, labels, n)
        loss_ref = causal_lm_loss(reference(input_ids=inputs).logits, labels, n)
        loss_tp.backward()
        loss_ref.backward()
        # Every gradient equals the unsharded model's (gathered): a norm's whose gradient must be
        # summed over the ranks (Qwen3's and Gemma-3's q/k head norms) included.
        reference_grads = dict(reference.named_parameters())
        grad_diff = {name: (full(p.grad) - reference_grads[name].grad).abs().max().item() for name, p in model.named_parameters()}
        opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
        opt.step()
        with torch.no_grad():
            after = causal_lm_loss(model(input_ids=inputs).logits, labels, n)
        worst = max(grad_diff, key=grad_diff.get)
        results[preset] = {"loss_tp": loss_tp.item(), "loss_ref": loss_ref.item(), "after_step": after.item(), "max_grad_diff": grad_diff[worst], "worst_grad": worst}
    if rank == 0:
        (out_dir / "tp_families.json").write_text(json.dumps(results))
    end_rank()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])

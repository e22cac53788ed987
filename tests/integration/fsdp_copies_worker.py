"""One rank of a count of autocast's weight copies under FSDP2 (gloo, CPU, 2 data-parallel ranks).

Usage: RANK=r WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python -m tests.integration.fsdp_copies_worker OUT_DIR
A Llama sharded by tinytrain's own fsdp_tp (model/tensor_parallel.py parallelize, tp 1), fp32 weights
under bf16 autocast, checkpointing none and full: what a forward keeps per layer whatever its tokens
(two depths, two lengths, the reading at zero tokens), written by rank 0 beside the plan's count of
the 16-bit copies (plan/activations.py weight_copy_bytes) and that count over the ranks.
"""

import json
import sys
from pathlib import Path

from benchmarks.rank_exit import end_rank


def main(out_dir: Path) -> None:
    import torch
    import torch.distributed as dist
    import transformers
    from torch.distributed.device_mesh import init_device_mesh

    from tests.activation_bytes import VOCAB, heap_frozen, kept_after_forward
    from tinytrain.model.activation_checkpointing import apply_checkpointing
    from tinytrain.model.tensor_parallel import parallelize
    from tinytrain.plan.activations import Layout, weight_copy_bytes
    from tinytrain.plan.model_shape import shape_from_hf

    dist.init_process_group("gloo")
    dp = dist.get_world_size()
    mesh = init_device_mesh("cpu", (dp, 1), mesh_dim_names=("data_parallel", "tensor_parallel"))

    def config(layers: int):
        return transformers.LlamaConfig(hidden_size=256, intermediate_size=704, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=layers, vocab_size=VOCAB, use_cache=False, pad_token_id=0)

    results = {}
    with heap_frozen():  # each reading's collections walk what it allocated (tests/activation_bytes.py)
        for mode in ("none", "full"):

            def kept(layers: int, seq: int, mode=mode) -> int:
                torch.manual_seed(0)
                model = transformers.AutoModelForCausalLM.from_config(config(layers), attn_implementation="sdpa").train()
                apply_checkpointing(model, mode)
                parallelize(model, mesh)
                return min(kept_after_forward(model, autocast=True, seq=seq) for _ in range(3))

            seq = 64
            per_layer = {n: (kept(4, n) - kept(2, n)) / 2 for n in (seq, 2 * seq)}
            copies = weight_copy_bytes(shape_from_hf(config(1), VOCAB), Layout.mixed)
            results[mode] = {"measured": 2 * per_layer[seq] - per_layer[2 * seq], "planned": copies if mode == "none" else 0.0, "copies": copies, "copies_over_dp": copies / dp}
    if dist.get_rank() == 0:
        (out_dir / "fsdp_copies.json").write_text(json.dumps(results, indent=2))
    end_rank()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

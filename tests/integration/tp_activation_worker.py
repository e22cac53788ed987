"""One rank of a tensor-parallel count of what a layer keeps for backward (gloo, CPU), tp = the world.

Usage: RANK=r WORLD_SIZE=2|4 MASTER_ADDR=... MASTER_PORT=... python -m tests.integration.tp_activation_worker OUT_DIR
A Llama with grouped-query heads, sharded by tinytrain's own tensor-parallel plan
(model/tensor_parallel.py's tp_plan; no FSDP, whose parameter all-gathers would move the count),
fp32 weights under bf16 autocast (fsdp_tp's layout), checkpointing none / selective / full through
model/activation_checkpointing.py: bytes per layer and token on this rank (tests/activation_bytes.py),
written by rank 0 beside the plan's count for that tp (kv heads: 2, or tp where tp is larger, so
they split).
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
    from torch.distributed.tensor.parallel import parallelize_module

    from tests.activation_bytes import VOCAB, per_layer_token
    from tinytrain.model.activation_checkpointing import apply_checkpointing
    from tinytrain.model.tensor_parallel import tp_plan
    from tinytrain.plan.activations import Layout, input_bytes, layer_bytes, selective_bytes
    from tinytrain.plan.model_shape import shape_from_hf

    dist.init_process_group("gloo")
    tp = dist.get_world_size()
    mesh = init_device_mesh("cpu", (tp,), mesh_dim_names=("tensor_parallel",))

    def config(layers: int):
        return transformers.LlamaConfig(hidden_size=256, intermediate_size=704, num_attention_heads=8, num_key_value_heads=max(2, tp), head_dim=64, num_hidden_layers=layers, vocab_size=VOCAB, use_cache=False, pad_token_id=0)

    shape = shape_from_hf(config(1), VOCAB)

    def counted(mode: str, tp: int) -> float:
        return {"none": layer_bytes(shape, Layout.mixed, tp), "selective": selective_bytes(shape, Layout.mixed, tp), "full": input_bytes(shape, Layout.mixed)}[mode]

    results = {}
    for mode in ("none", "selective", "full"):

        def build(layers: int, mode=mode):
            torch.manual_seed(0)
            model = transformers.AutoModelForCausalLM.from_config(config(layers), attn_implementation="sdpa").train()
            parallelize_module(model, mesh, tp_plan(model))
            apply_checkpointing(model, mode)
            return model

        # 512 tokens, the middle of 3: a collective's buffer freed early or late moves one reading by ~0.4 MB.
        results[mode] = {"measured": per_layer_token(build, autocast=True, seq=512, repeats=3), "planned": counted(mode, tp), "whole_over_tp": counted(mode, 1) / tp}
    if dist.get_rank() == 0:
        (out_dir / "tp_activations.json").write_text(json.dumps(results, indent=2))
    end_rank()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""One rank of compiled blocks under tensor parallelism, by checkpointing mode (gloo, CPU, tp = the world).

Usage: RANK=r WORLD_SIZE=2 MASTER_ADDR=... MASTER_PORT=... python -m tests.integration.tp_compile_worker OUT_DIR
A small Llama sharded as fsdp_tp shards it (model/tensor_parallel.py: torch's ColwiseParallel /
RowwiseParallel on a dp 1 x tp mesh, FSDP2 around), fp32 weights under bf16 autocast, checkpointed
through model/activation_checkpointing.py, each block compiled (model/compile.py, aot_eager), two
forward and backward passes per mode. Rank 0 writes what each mode did (tp_compile.json): "trained"
with the parameter whose gradients (summed over both passes) differ most from the eager,
uncheckpointed model's, or the error torch raised: whether every mode trains, and gets every
gradient (the embedding's is the one a compiled block can lose: model/tensor_parallel.py plain_output).
"""

import json
import sys
from pathlib import Path

from benchmarks.rank_exit import end_rank


def main(out_dir: Path) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    import transformers
    from torch.distributed.device_mesh import init_device_mesh

    from tinytrain.model.activation_checkpointing import apply_checkpointing
    from tinytrain.model.compile import apply_compile
    from tinytrain.model.tensor_parallel import parallelize

    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (1, dist.get_world_size()), mesh_dim_names=("data_parallel", "tensor_parallel"))
    config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2, vocab_size=256, use_cache=False)
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))

    def gradients(mode: str, compiled: bool) -> dict:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").train()
        # In train/fit.py's order: checkpointing and compile on the built model, sharding after
        # (the module's configure_model), so hooks the sharding adds run after any added before.
        apply_checkpointing(model, mode)
        if compiled:
            apply_compile(model, "blocks", "aot_eager")
        parallelize(model, mesh)
        for _ in range(2):
            with torch.autocast("cpu", torch.bfloat16):
                logits = model(input_ids=ids).logits
            F.cross_entropy(logits[:, :-1].reshape(-1, 256).float(), ids[:, 1:].reshape(-1)).backward()
        return {name: p.grad.full_tensor() for name, p in model.named_parameters()}

    eager = gradients("none", compiled=False)
    results = {}
    for mode in ("none", "selective", "full"):
        try:
            grads = gradients(mode, compiled=True)
            worst = max(eager, key=lambda name: ((grads[name] - eager[name]).norm() / eager[name].norm()).item())
            results[mode] = {"result": "trained", "worst_gradient": worst, "relative_difference": ((grads[worst] - eager[worst]).norm() / eager[worst].norm()).item()}
        except Exception as error:  # what torch raised, for the test to read
            results[mode] = {"result": f"{type(error).__name__}: {error}"[:500]}
        torch._dynamo.reset()
    if dist.get_rank() == 0:
        (out_dir / "tp_compile.json").write_text(json.dumps(results, indent=2))
    end_rank()


if __name__ == "__main__":
    main(Path(sys.argv[1]))

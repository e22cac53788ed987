"""One rank of a tensor-parallel count of what a layer keeps for backward (gloo, CPU), tp = the world.

Usage: RANK=r WORLD_SIZE=2|4 MASTER_ADDR=... MASTER_PORT=... python -m tests.integration.tp_activation_worker OUT_DIR
A Llama with grouped-query heads, sharded by tinytrain's own tensor-parallel plan
(model/tensor_parallel.py's tp_plan; no FSDP, whose parameter all-gathers would move the count),
fp32 weights under bf16 autocast (fsdp_tp's layout), checkpointing none / selective / full through
model/activation_checkpointing.py: bytes per layer and token on this rank (tests/activation_bytes.py),
written by rank 0 beside the plan's count for that tp (kv heads: 2, or tp where tp is larger, so
they split). Then the chunked loss through the vocab-sharded lm_head (tinytrain's own
CausalLMModule.batch_loss): its backward's peak per chunk token and vocab row, from two chunk
sizes, beside the plan's count (tp_chunked_loss.json).
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

    from tests.activation_bytes import VOCAB, heap_frozen, per_layer_token
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
    # The imports out of the collector's reach: each reading's two full collections walk what it
    # allocated, not the whole heap (tests/activation_bytes.py heap_frozen).
    with heap_frozen():
        # Full checkpointing keeps the layer's input, whole on every rank whatever the tp: tp 2 checks it.
        for mode in ("none", "selective", "full") if tp == 2 else ("none", "selective"):

            def build(layers: int, mode=mode):
                torch.manual_seed(0)
                model = transformers.AutoModelForCausalLM.from_config(config(layers), attn_implementation="sdpa").train()
                parallelize_module(model, mesh, tp_plan(model))
                apply_checkpointing(model, mode)
                return model

            # 512 tokens, the middle of 3: a collective's buffer freed early or late moves one reading by ~0.4 MB.
            results[mode] = {"measured": per_layer_token(build, autocast=True, seq=512, repeats=3), "planned": counted(mode, tp), "whole_over_tp": counted(mode, 1) / tp}
        chunked = chunked_loss_peak(mesh)
    if dist.get_rank() == 0:
        (out_dir / "tp_activations.json").write_text(json.dumps(results, indent=2))
        (out_dir / "tp_chunked_loss.json").write_text(json.dumps(chunked, indent=2))
    end_rank()


def chunked_loss_peak(mesh, vocab: int = 4096, seq: int = 1024, chunks: tuple[int, int] = (128, 512)) -> dict:
    """Bytes per chunk token and vocab row that the chunked loss's backward adds to the peak, as
    measured (the middle of three readings per chunk size) and as planned. A 4096-row vocab over a
    128-wide model, so the vocab terms dominate."""
    import torch
    import transformers
    from torch.distributed.tensor.parallel import parallelize_module

    from tests.activation_bytes import kept_and_peak_by_loss
    from tinytrain.model.module import CausalLMModule
    from tinytrain.model.module_spec import ModuleSpec
    from tinytrain.model.tensor_parallel import tp_plan
    from tinytrain.plan.activations import Layout
    from tinytrain.plan.memory import activation_parts
    from tinytrain.plan.model_shape import shape_from_hf

    tp = mesh.size()
    heads = max(2, tp)
    cfg = transformers.LlamaConfig(hidden_size=128, intermediate_size=256, num_attention_heads=heads, num_key_value_heads=heads, head_dim=128 // heads, num_hidden_layers=1, vocab_size=vocab, use_cache=False, pad_token_id=0)
    excess, planned = {}, {}
    for chunk in chunks:
        torch.manual_seed(0)
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").train()
        parallelize_module(model, mesh, tp_plan(model))
        module = CausalLMModule(model, ModuleSpec(vocab, loss_chunk_tokens=chunk))
        readings = []
        for _ in range(3):
            kept, peak = kept_and_peak_by_loss(module.batch_loss, autocast=True, seq=seq)
            readings.append(peak - kept)
            module.zero_grad(set_to_none=True)
        excess[chunk] = sorted(readings)[1]
        planned[chunk] = activation_parts(shape=shape_from_hf(cfg, vocab), layout=Layout.mixed, seq=seq, micro_batch=1, tp=tp, flash=True, logits_tokens=chunk).backward
    small, large = chunks
    per_row = lambda bytes_by_chunk: (bytes_by_chunk[large] - bytes_by_chunk[small]) / (large - small) / vocab  # noqa: E731
    return {"measured": per_row(excess), "planned": per_row(planned)}


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Packed documents stay isolated on flash-attn: the training forward of a packed batch (micro
batch 1 and 4) against each document run alone. On a GPU with flash-attn importable it uses the
real kernel in bf16; otherwise (`--reference`, or no flash-attn) transformers' flash dispatch with
tinytrain/model/flash_reference.py's CPU stand-in, in fp32.

    python benchmarks/flash_isolation.py [--reference] [--json PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import json

import torch


def packed_batch(micro: int, seq: int, vocab: int, g: torch.Generator) -> dict:
    """Rows of several documents each, position ids restarting per document."""
    rows, positions = [], []
    for _ in range(micro):
        lengths, left = [], seq
        while left > 0:
            n = min(left, int(torch.randint(8, seq // 2, (1,), generator=g)))
            lengths.append(n)
            left -= n
        positions.append(torch.cat([torch.arange(n) for n in lengths]))
        rows.append(torch.randint(0, vocab, (seq,), generator=g))
    return {"input_ids": torch.stack(rows), "position_ids": torch.stack(positions)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reference", action="store_true", help="the CPU stand-in even where flash-attn is importable")
    parser.add_argument("--json")
    args = parser.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM

    from tinytrain.data.collate import with_document_boundaries
    from tinytrain.model.module import MODEL_INPUTS, CausalLMModule

    real = not args.reference and torch.cuda.is_available() and importlib.util.find_spec("flash_attn") is not None
    if real:
        implementation, device, dtype, atol = "flash_attention_2", "cuda", torch.bfloat16, 2e-2  # bf16 round-off
    else:
        from tinytrain.model.flash_reference import use_reference_flash

        implementation, device, dtype, atol = use_reference_flash(), "cpu", torch.float32, 1e-5
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    model = LlamaForCausalLM._from_config(config, attn_implementation=implementation).to(device, dtype).eval()
    module = CausalLMModule(model, trainer_cfg=None, true_vocab=1024, checkpoint_metadata={})
    g = torch.Generator().manual_seed(0)
    results = {}
    for micro in (1, 4):
        batch = with_document_boundaries(packed_batch(micro, 128, 1024, g))
        inputs = {k: (v.to(device) if torch.is_tensor(v) else v) for k, v in batch.items() if k in MODEL_INPUTS}
        worst = 0.0
        with torch.no_grad():
            packed = module(**inputs).float()
            for row in range(micro):
                starts = (batch["position_ids"][row] == 0).nonzero().flatten().tolist() + [128]
                for a, b in zip(starts, starts[1:]):
                    alone = model(input_ids=inputs["input_ids"][row, a:b][None], use_cache=False).logits[0].float()
                    worst = max(worst, float((packed[row, a:b] - alone).abs().max()))
        results[f"micro{micro}"] = worst
        print(f"{implementation} micro batch {micro}: max |packed - alone| = {worst:.3g} (tolerance {atol:g})")
    ok = all(v <= atol for v in results.values())
    print("isolation", "holds" if ok else "BROKEN")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kernel": "flash-attn" if real else "cpu reference", "max_abs_diff": results, "tolerance": atol, "ok": ok}, f, indent=2)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()

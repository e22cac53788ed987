"""Packed documents stay isolated on a kernel: the training forward of a packed batch (micro batch 1
and 4) against each document run alone, for a Llama (grouped-query heads) and a Mistral with a
sliding window shorter than the documents. On a CUDA GPU the real kernel in bf16: `varlen` torch's
own (tinytrain/model/varlen_attention.py), `sdpa` PyTorch SDPA with the block-diagonal mask, `flash`
flash-attn 2 (where installed). On a CPU (or `--reference`) in fp32, with
tinytrain/model/flash_reference.py's pure-torch kernels standing in for the CUDA-only ones.

    python benchmarks/packed_isolation.py --kernel varlen [--reference] [--json PATH]
"""

from __future__ import annotations

import argparse
import json

import torch

KERNELS = ("varlen", "sdpa", "flash")


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


def implementation(kernel: str, real: bool) -> str:
    """The attention implementation's name, registered with transformers where it is tinytrain's."""
    if kernel == "sdpa":
        return "sdpa"
    if kernel == "flash":
        if real:
            return "flash_attention_2"
        from tinytrain.model.flash_reference import use_reference_flash

        return use_reference_flash()
    if real:
        from tinytrain.model.varlen_attention import use_torch_varlen

        return use_torch_varlen()
    from tinytrain.model.flash_reference import varlen_attn_reference
    from tinytrain.model.varlen_attention import use_varlen
    from tinytrain.plan.torch_varlen import read_support

    return use_varlen(varlen_attn_reference, read_support(varlen_attn_reference, "reference"), "torch_varlen_reference")


def tiny(arch: str, attention: str, device: str, dtype: torch.dtype):
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

    torch.manual_seed(0)
    shape = dict(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, use_cache=False)
    if arch == "mistral":  # a window of 24 tokens: shorter than most documents below
        return MistralForCausalLM._from_config(MistralConfig(**shape, sliding_window=24), attn_implementation=attention).to(device, dtype).eval()
    return LlamaForCausalLM._from_config(LlamaConfig(**shape), attn_implementation=attention).to(device, dtype).eval()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--kernel", choices=KERNELS, default="varlen")
    parser.add_argument("--reference", action="store_true", help="the CPU stand-in kernels even on a GPU")
    parser.add_argument("--json")
    args = parser.parse_args()
    from tinytrain.data.collate import with_document_boundaries
    from tinytrain.model.module import MODEL_INPUTS, CausalLMModule
    from tinytrain.model.module_spec import ModuleSpec

    real = not args.reference and torch.cuda.is_available()
    device, dtype, atol = ("cuda", torch.bfloat16, 2e-2) if real else ("cpu", torch.float32, 1e-5)  # bf16 round-off on a GPU
    name = implementation(args.kernel, real)
    g = torch.Generator().manual_seed(0)
    results = {}
    for arch in ("llama", "mistral"):
        model = tiny(arch, name, device, dtype)
        module = CausalLMModule(model, ModuleSpec(1024))
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
            results[f"{arch} micro{micro}"] = worst
            print(f"{name} {arch} micro batch {micro}: max |packed - alone| = {worst:.3g} (tolerance {atol:g})")
    ok = all(v <= atol for v in results.values())
    print("isolation", "holds" if ok else "BROKEN")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"kernel": name if real else f"{name} (cpu reference)" if name != "sdpa" else "sdpa (cpu)", "max_abs_diff": results, "tolerance": atol, "ok": ok}, f, indent=2)
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()

"""finetune=lora|qlora: what the adapters add, which vocab rows train with them, and the memory.

Decided here once, without weights: the adapter parameter count (rank x (in + out) for every
targeted projection of every layer), the token rows that train beside the adapters, the dtype the
frozen base is held in, and the per-GPU model-state memory. The model stage applies it
(tinytrain/model/lora.py); the export merges it (tinytrain/checkpoint/lora_weights.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tinytrain.config.dtype import Dtype
from tinytrain.config.schema import FinetuneMethod, Mode, TrainableTokens
from tinytrain.errors import Problem
from tinytrain.plan import parallel
from tinytrain.plan.families import LLAMA_PROJECTIONS, Family, family
from tinytrain.plan.memory import AdapterStates, ModelStateMemory, StateLayout
from tinytrain.plan.model_shape import ModelShape

# Bytes per frozen base weight: the compute dtype's, or NF4's half byte plus its double-quantized
# constants (one fp8 absmax per 64 weights, one fp32 per 256 blocks: ~0.127 bits per weight).
FROZEN_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp32": 4.0, "nf4": 0.5 + 0.127 / 8}


@dataclass(frozen=True)
class FinetunePlan:
    method: str  # lora | qlora
    rank: int
    alpha: float
    dropout: float
    target_modules: tuple[str, ...]
    adapter_params: int
    trainable_token_ids: tuple[int, ...]  # rows of the embedding and lm_head that train (gradients of the others are masked)
    trainable_tokens_reason: str
    trainable_params: int  # adapters + the vocab tables when rows of them train
    frozen_dtype: str  # bf16 | fp16 | fp32 | nf4 (qlora's quantized projections)
    base: str  # model.pretrained or checkpoint.init_from

    @property
    def scaling(self) -> float:
        return self.alpha / self.rank

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "rank": self.rank,
            "alpha": self.alpha,
            "dropout": self.dropout,
            "target_modules": list(self.target_modules),
            "adapter_params": self.adapter_params,
            "trainable_params": self.trainable_params,
            "trainable_token_ids": list(self.trainable_token_ids),
            "trainable_tokens_reason": self.trainable_tokens_reason,
            "frozen_dtype": self.frozen_dtype,
            "base": self.base,
        }


def projection_dims(shape: ModelShape) -> dict[str, tuple[int, int]]:
    """(in, out) features of each projection of a block, Phi-3's fused ones (qkv_proj, gate_up_proj) too."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    h, i = shape.hidden, shape.intermediate
    return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h), "qkv_proj": (h, q + 2 * kv), "gate_up_proj": (h, 2 * i)}


def targets(finetune_cfg, fam: Family) -> tuple[str, ...]:
    """finetune.target_modules, or (null) every projection of the family's block."""
    return tuple(finetune_cfg.target_modules) if finetune_cfg.target_modules is not None else fam.projections


def adapter_parameter_count(shape: ModelShape, rank: int, targets) -> int:
    dims = projection_dims(shape)
    return shape.layers * sum(rank * (dims[t][0] + dims[t][1]) for t in targets)


def vocab_table_params(shape: ModelShape) -> int:
    return shape.vocab * shape.hidden * (1 if shape.tied_embeddings else 2)


def problems(cfg) -> list[Problem]:
    """Settings LoRA/QLoRA cannot run with, each with its fix (validate.py reports them with the rest)."""
    f = cfg.finetune
    if f.method == FinetuneMethod.full:
        return []
    key = f"finetune={f.method.value}"
    found = []
    if f.rank < 1:
        found.append(Problem("finetune.rank", f.rank, "must be >= 1", "use e.g. finetune.rank=16"))
    if not (math.isfinite(f.alpha) and f.alpha > 0):
        found.append(Problem("finetune.alpha", f.alpha, "must be positive and finite (adapter updates are scaled by alpha / rank)", "use e.g. finetune.alpha=32 (twice the rank)"))
    if not 0 <= f.dropout < 1:
        found.append(Problem("finetune.dropout", f.dropout, "must be in [0, 1)", "use e.g. finetune.dropout=0.05"))
    fam = family(cfg.model.arch)
    chosen = targets(f, fam)
    unknown = [t for t in chosen if t not in fam.projections]
    if unknown or not chosen:
        found.append(Problem("finetune.target_modules", list(chosen), f"{'unknown projection(s) ' + ', '.join(unknown) if unknown else 'is empty'}: adapters go on a model.arch={fam.arch.value} block's linear layers", f"pick from {', '.join(fam.projections)} (null, the default, is all of them)"))
    elif len(set(chosen)) < len(chosen):  # the plan counted a repeated projection's adapters twice
        found.append(Problem("finetune.target_modules", list(chosen), "names a projection more than once", f"list each once, e.g. finetune.target_modules=[{','.join(dict.fromkeys(chosen))}]"))
    if not cfg.model.pretrained and not cfg.checkpoint.init_from:
        if f.method == FinetuneMethod.qlora:  # its base is quantized while a Hugging Face folder loads: no init_from
            found.append(Problem("model.pretrained", None, f"{key} adapts a base model and model.pretrained names none (adapters on random weights learn nothing a base knows)", "set model.pretrained=<Hugging Face folder> (a tinytrain checkpoint: export it with mode=export, then model.pretrained=<its hf_export folder>), or use finetune=full"))
        else:
            found.append(Problem("model.pretrained", None, f"{key} adapts a base model and neither model.pretrained nor checkpoint.init_from names one (adapters on random weights learn nothing a base knows)", "set model.pretrained=<Hugging Face folder> or checkpoint.init_from=<tinytrain checkpoint>, or use finetune=full"))
    found += parallel.lora_problems(cfg, key)
    if f.method == FinetuneMethod.qlora:
        if cfg.checkpoint.init_from and not cfg.model.pretrained:
            found.append(Problem("checkpoint.init_from", cfg.checkpoint.init_from, "finetune=qlora quantizes its base while loading a Hugging Face folder", "export the checkpoint (mode=export) and set model.pretrained=<that hf_export folder>"))
        found += parallel.qlora_problems(cfg)
        if cfg.mode == Mode.train:
            found += qlora_runtime_problems()
    return found


def qlora_runtime_problems() -> list[Problem]:
    """QLoRA trains only where bitsandbytes' CUDA kernels run (mode=plan works anywhere)."""
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        return [Problem("finetune", "qlora", "4-bit QLoRA needs a CUDA GPU (bitsandbytes' NF4 kernels) and this machine has none", "plan it here with mode=plan hardware.gpu=A100 (or T4, V100...), train it on a GPU machine with pip install 'tinytrain-llm[qlora]', or use finetune=lora on this machine")]
    if importlib.util.find_spec("bitsandbytes") is None:
        return [Problem("finetune", "qlora", "bitsandbytes is not installed", "pip install 'tinytrain-llm[qlora]' (bitsandbytes), or use finetune=lora")]
    return []


def trainable_tokens(f, tokenizer, base_rows: int, rows_to_fix) -> tuple[tuple[int, ...], str]:
    """Rows the base never trained: tokens added beyond its vocab and rows preflight rewrites."""
    if f.trainable_tokens == TrainableTokens.none:
        return (), "finetune.trainable_tokens=none: only the adapters train"
    added = list(range(base_rows, len(tokenizer)))
    fixed = sorted({r.token_id for r in rows_to_fix} - set(added))
    ids = tuple(added + fixed)
    if not ids:
        return (), "none: every token's rows were trained in the base"
    parts = ([f"{len(added)} token(s) added beyond the base's {base_rows} rows ({', '.join(tokenizer.convert_ids_to_tokens(added[:4]))}{', ...' if len(added) > 4 else ''})"] if added else []) + ([f"{len(fixed)} untrained row(s) preflight rewrites"] if fixed else [])
    return ids, " and ".join(parts) + ": their embedding and lm_head rows train with the adapters (the other rows stay frozen)"


def make(cfg, shape: ModelShape, tokenizer, *, base_rows: int, rows_to_fix, compute: Dtype, fam: Family) -> FinetunePlan | None:
    """`fam`: the built model's family (a pretrained model's own), whose projections are the default targets."""
    f = cfg.finetune
    if f.method == FinetuneMethod.full:
        return None
    chosen = targets(f, fam)
    adapters = adapter_parameter_count(shape, f.rank, chosen)
    ids, reason = trainable_tokens(f, tokenizer, base_rows, rows_to_fix)
    return FinetunePlan(
        method=f.method.value,
        rank=f.rank,
        alpha=float(f.alpha),
        dropout=float(f.dropout),
        target_modules=chosen,
        adapter_params=adapters,
        trainable_token_ids=ids,
        trainable_tokens_reason=reason,
        trainable_params=adapters + (vocab_table_params(shape) if ids else 0),
        frozen_dtype="nf4" if f.method == FinetuneMethod.qlora else compute.value,
        base=str(cfg.model.pretrained or cfg.checkpoint.init_from),
    )


def adapter_state_memory(plan: FinetunePlan, shape: ModelShape, params: int, *, strategy, layout: StateLayout) -> ModelStateMemory:
    """Bytes per GPU with a frozen base: the strategy's formula (plan/parallel.py) over the
    trainable weights, the frozen ones and the frozen base's bytes in its dtype."""
    t = float(plan.trainable_params)
    frozen = float(params - (vocab_table_params(shape) if plan.trainable_token_ids else 0))
    if plan.method == "qlora":
        # NF4 holds the block projections; embeddings, lm_head and norms stay in the compute dtype.
        linear = shape.layers * sum(i * o for name, (i, o) in projection_dims(shape).items() if name in LLAMA_PROJECTIONS)
        base = linear * FROZEN_BYTES["nf4"] + (frozen - linear) * 2.0
    else:
        base = frozen * FROZEN_BYTES[plan.frozen_dtype]
    return parallel.adapter_state_memory(strategy, AdapterStates(trainable=t, frozen=frozen, frozen_bytes=base), layout)

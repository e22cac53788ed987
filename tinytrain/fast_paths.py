"""Which fast paths a run uses, chosen by default where they are safe, each with its reason."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tinytrain.config.schema import Strategy

# A 128k-vocab logit tensor in fp32 for 8 x 2048 tokens is 8 GiB: above this size the loss is
# computed from hidden states in chunks of tokens instead.
CHUNKED_LOSS_MIN_VOCAB = 65536


@dataclass(frozen=True)
class FastPaths:
    fused_adamw: bool
    compile: bool
    loss_chunk_tokens: int  # 0: plain cross-entropy over full logits
    activation_checkpointing: bool
    reasons: dict

    def to_dict(self) -> dict:
        return asdict(self)


def select_fast_paths(trainer_cfg, strategy: Strategy, on_gpu: bool, padded_vocab: int) -> FastPaths:
    reasons = {}
    fused = on_gpu and strategy != Strategy.fsdp_tp and strategy != Strategy.deepspeed
    reasons["fused_adamw"] = (
        "CUDA tensors" if fused else "DeepSpeed/DTensor parameters or CPU: foreach AdamW" if on_gpu else "CPU: foreach AdamW"
    )
    chunk = trainer_cfg.loss_chunk_tokens
    if chunk is None:
        auto = padded_vocab >= CHUNKED_LOSS_MIN_VOCAB and strategy != Strategy.fsdp_tp
        chunk = 1024 if auto else 0
        if auto:
            reasons["loss_chunk_tokens"] = f"vocab {padded_vocab} >= {CHUNKED_LOSS_MIN_VOCAB}: logits computed 1024 tokens at a time"
        elif strategy == Strategy.fsdp_tp and padded_vocab >= CHUNKED_LOSS_MIN_VOCAB:
            reasons["loss_chunk_tokens"] = "off: the lm_head is vocab-sharded under fsdp_tp"
        else:
            reasons["loss_chunk_tokens"] = f"off: vocab {padded_vocab} < {CHUNKED_LOSS_MIN_VOCAB}"
    else:
        reasons["loss_chunk_tokens"] = "as configured"
    if chunk and strategy == Strategy.fsdp_tp:
        chunk = 0
        reasons["loss_chunk_tokens"] = "off: the lm_head is vocab-sharded under fsdp_tp"
    reasons["compile"] = "trainer.compile=true" if trainer_cfg.compile else "off (trainer.compile=true turns it on)"
    ac = trainer_cfg.activation_checkpointing
    reasons["activation_checkpointing"] = "on: recompute each layer in backward" if ac else "off (memory allows; trainer.activation_checkpointing=true trades compute for memory)"
    return FastPaths(fused, bool(trainer_cfg.compile), int(chunk), bool(ac), reasons)

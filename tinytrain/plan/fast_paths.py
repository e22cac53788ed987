"""Which fast paths a run uses, chosen by default where they are safe, each with its reason."""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass

from tinytrain.config.schema import CompileMode, Strategy
from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.activations import LOSS_PEAK_BYTES
from tinytrain.plan.checkpointing import CheckpointingPlan, choose
from tinytrain.plan.extras import DISTRIBUTION
from tinytrain.plan.levers import checkpointing_mode, compile_mode
from tinytrain.plan.parallel import strategy_row

# A 128k-vocab logit tensor in fp32 for 8 x 2048 tokens is 8 GiB: above this size the loss is
# computed from hidden states in chunks of tokens instead.
CHUNKED_LOSS_MIN_VOCAB = 65536
# And where one sequence's logits are this many (tokens x vocab rows) whatever the vocab: the plain
# loss's backward would hold 12 B of each (LOSS_PEAK_BYTES), 6 GiB a sequence,
# where the chunks' recompute of the head costs under 1% of a step (2 x hidden x vocab FLOPs a token).
CHUNKED_LOSS_MIN_LOGITS = 2**29


@dataclass(frozen=True)
class FastPaths:
    fused_adamw: bool
    compile: str  # none | blocks | model (CompileMode)
    loss_chunk_tokens: int  # 0: plain cross-entropy over full logits
    activation_checkpointing: str  # none | full | selective, resolved (plan/checkpointing.py)
    reasons: dict
    liger: bool = False  # liger-kernel's RMSNorm, SwiGLU and RoPE kernels
    liger_loss: bool = False  # liger's fused linear cross-entropy (no logits tensor at all)
    checkpoint_every: int = 1  # checkpoint every n-th block (selective where the op policy cannot run)
    compile_backend: str = "inductor"

    def to_dict(self) -> dict:
        return asdict(self)


def liger_installed() -> bool:
    return importlib.util.find_spec("liger_kernel") is not None


# Measured through tinytrain's CLI on two CPU ranks with torch's recompile and graph-break logs
# (12 layers). Under ZeRO-3 compiled blocks compile once (model/compile.py), the whole model does not:
# DeepSpeed's hooks on each layer run inside its graph.
ZERO3_BLOCKS = ", its forward inside DeepSpeed's hooks, which gather the layer's weights whole under ZeRO-3 (12 layers on two CPU ranks: no graph break, one recompile)"
ZERO3_MODEL = (
    ", but under ZeRO-3 DeepSpeed's hooks on each layer break the graph and recompile it per layer "
    "(12 layers on two CPU ranks: 41 graph breaks and 26 recompiles, torch's recompile limit reached): trainer.compile=blocks compiles each layer whole"
)


def select_fast_paths(trainer_cfg, strategy: Strategy, *, on_gpu: bool, padded_vocab: int, liger_available: bool = False, zero_stage: int = 0, logits_only: str | None = None, checkpointing: CheckpointingPlan | None = None, seq_len: int = 0, planning: bool = True) -> FastPaths:
    """`logits_only`: why the family's loss must come from its own logits (Gemma-2 soft-caps them
    inside its forward), which rules out the losses from hidden states and liger's kernels.
    `seq_len`: the tokens of a sequence (data.seq_len), whose logits turn the chunked loss on too.
    `checkpointing`: the planner's choice (plan/checkpointing.py); without one, the configured mode
    (auto: none, as where no GPU memory is known)."""
    reasons = {}
    row = strategy_row(strategy)
    fused = on_gpu and row.fused_adamw
    reasons["fused_adamw"] = (
        "CUDA tensors" if fused else "DeepSpeed/DTensor parameters: foreach AdamW" if on_gpu else "CPU: AdamW's per-tensor loop"
    )
    liger, liger_loss = select_liger(trainer_cfg.liger, row.liger_off, on_gpu=on_gpu, available=liger_available, zero_stage=zero_stage, reasons=reasons, logits_only=logits_only, planning=planning)
    chunk = trainer_cfg.loss_chunk_tokens
    if liger_loss:
        chunk = 0
        reasons["loss_chunk_tokens"] = "off: liger's fused linear cross-entropy never builds the logits"
    elif chunk is None:
        why = large_logits(padded_vocab, seq_len)
        chunk = 1024 if why else 0
        if chunk:
            reasons["loss_chunk_tokens"] = f"{why}: logits computed 1024 tokens at a time"
        else:
            reasons["loss_chunk_tokens"] = f"off: vocab {padded_vocab} < {CHUNKED_LOSS_MIN_VOCAB}"
    else:
        reasons["loss_chunk_tokens"] = "as configured"
    if chunk and logits_only:
        if trainer_cfg.loss_chunk_tokens:
            raise ConfigError(Problem("trainer.loss_chunk_tokens", chunk, f"the chunked loss computes logits from hidden states, but {logits_only}", "set trainer.loss_chunk_tokens=0 (or null)"))
        chunk = 0
        reasons["loss_chunk_tokens"] = f"off: {logits_only}"
    compiling = compile_mode(trainer_cfg.compile)
    zero3 = row.deepspeed and zero_stage == 3
    reasons["compile"] = {
        CompileMode.none: "off (trainer.compile=blocks compiles each transformer block)",
        CompileMode.blocks: f"each transformer block compiled on its own ({trainer_cfg.compile_backend}): compile time does not grow with depth" + (ZERO3_BLOCKS if zero3 else ""),
        CompileMode.model: f"the whole model as one graph ({trainer_cfg.compile_backend})" + (ZERO3_MODEL if zero3 else ""),
    }[compiling]
    if checkpointing is None:
        checkpointing = choose(checkpointing_mode(trainer_cfg.activation_checkpointing), [], row.op_checkpoint_off(zero_stage))
    reasons["activation_checkpointing"] = f"{checkpointing.how} ({checkpointing.reason})"
    return FastPaths(fused, compiling.value, int(chunk), checkpointing.mode, reasons, liger, liger_loss, checkpointing.every, trainer_cfg.compile_backend)


def large_logits(padded_vocab: int, seq_len: int) -> str | None:
    """Why the plain loss's logits are too large to hold whole, or None."""
    if padded_vocab >= CHUNKED_LOSS_MIN_VOCAB:
        return f"vocab {padded_vocab} >= {CHUNKED_LOSS_MIN_VOCAB}"
    if seq_len * padded_vocab >= CHUNKED_LOSS_MIN_LOGITS:
        return f"{seq_len} tokens x vocab {padded_vocab}: the plain loss's backward would hold {seq_len * padded_vocab * LOSS_PEAK_BYTES / 2**30:.0f} GiB a sequence"
    return None


def select_liger(requested: bool | None, strategy_blocker: str | None, *, on_gpu: bool, available: bool, zero_stage: int, reasons: dict, logits_only: str | None = None, planning: bool = True) -> tuple[bool, bool]:
    """(kernels, fused loss). trainer.liger: null = where it can run, true = required, false = off.
    Triton kernels need CUDA; `strategy_blocker`: why the strategy rules them out (the strategy
    table's liger_off: under fsdp_tp the norms and the lm_head are DTensors, which they are not
    checked on); under ZeRO-3 the lm_head weight is partitioned outside the model's forward, so the
    fused loss (which reads it directly) stays off there."""
    blocker = "CPU: Triton kernels need a CUDA GPU" if not on_gpu else strategy_blocker or logits_only
    if requested is False:
        reasons["liger"] = "off (trainer.liger=false)"
        return False, False
    if blocker:
        if requested:
            raise ConfigError(Problem("trainer.liger", True, f"liger-kernel cannot run here ({blocker})", "set trainer.liger=null (on where it can run) or false"))
        reasons["liger"] = f"off: {blocker}"
        return False, False
    if not available:
        if requested and not planning:  # this is the machine that runs it: the import would fail after the data and the model are built
            raise ConfigError(Problem("trainer.liger", True, "needs liger-kernel, which is not installed here", f"pip install '{DISTRIBUTION}[gpu]', or set trainer.liger=null (on where it is installed)"))
        if requested:
            reasons["liger"] = f"as configured; liger-kernel is not installed on this machine: the one that trains needs it (pip install '{DISTRIBUTION}[gpu]')"
            return True, zero_stage != 3
        reasons["liger"] = f"off: liger-kernel is not installed (pip install '{DISTRIBUTION}[gpu]')"
        return False, False
    fused_loss = zero_stage != 3
    how = "RMSNorm, SwiGLU, RoPE kernels" + (" and fused linear cross-entropy" if fused_loss else "; loss unfused: ZeRO-3 partitions the lm_head outside the forward")
    reasons["liger"] = ("as configured: " if requested else "liger-kernel installed and a CUDA GPU: ") + how
    return True, fused_loss

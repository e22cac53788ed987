"""Long context: how `parallel.cp` splits each micro batch's sequence, and the longest context that fits.

With cp > 1 the ranks of a cp group share one micro batch: each holds seq_len / cp of its tokens
between attention calls, and attention sees the whole sequence through the engine the strategy
runs (plan/parallel.py's `cp_kinds`): DeepSpeed's Ulysses under the ZeRO strategies and under
fsdp_tp with tp 1 (an all-to-all trades the sequence split for a head split, so every rank attends
over all tokens with heads / cp heads). Data parallelism is world / (tp x cp) (plan/layout.py).

The planner owns activation memory as a function of seq_len, cp, micro batch and activation
checkpointing (plan/memory.py), so it can print the longest `data.seq_len` that fits the GPU for
the planned layout and for twice its cp, and refuse a context that does not fit, naming the cp that
would.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass

from tinytrain.config.schema import Attention, ContextParallelKind, DataFormat, Objective
from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.memory import GIB
from tinytrain.plan.parallel import STRATEGIES, strategy_row

# What each kind runs on, and where it was proven (printed in the plan and docs/parallelism.md, "Long context").
ENGINES = {
    "ulysses": "DeepSpeed's UlyssesSPAttentionHF (deepspeed.runtime.sequence_parallel.ulysses_sp)",
}
PROVEN = {
    "ulysses": "equal to cp=1 in loss and gradients on CPU over gloo (tests/integration/test_context_parallel.py); not yet on GPUs",
}
# The longest context is searched in steps of this many tokens per cp rank.
CONTEXT_STEP = 1024
LONGEST_SEARCHED = 1 << 24  # 16M tokens
# parallel.cp=null picks a cp whose estimate stays under this share of the GPU: the estimate does not
# count the allocator's fragmentation, communication buffers or the CUDA context.
AUTO_MARGIN = 0.9


@dataclass(frozen=True)
class ContextPlan:
    cp: int
    kind: str  # "none" (cp 1), "ulysses"
    reason: str
    local_seq_len: int  # the tokens of one sequence a rank holds between attention calls
    engine: str = ""
    proven: str = ""
    longest: tuple = ()  # ((cp, longest data.seq_len that fits), ...) for cp and 2 x cp; () without GPU memory

    def longest_at(self, cp: int) -> int | None:
        return dict(self.longest).get(cp)

    def to_dict(self) -> dict:
        return {**asdict(self), "longest": {str(cp): seq for cp, seq in self.longest}}


def kinds_that_run() -> str:
    """The parallel presets (conf/parallel/*.yaml) whose strategy splits sequences."""
    from omegaconf import OmegaConf

    from tinytrain.config import CONF_DIR

    runs = {s.value for s, r in STRATEGIES.items() if r.cp_kinds}
    presets = sorted(p.stem for p in (CONF_DIR / "parallel").glob("*.yaml") if OmegaConf.load(p).strategy in runs)
    return "parallel=" + "|".join(presets)


def problems(cfg) -> list[Problem]:
    """parallel.cp and cp_kind against the strategy, the model's heads, the sequence and the attention."""
    par, m = cfg.parallel, cfg.model
    if par.cp is None:
        return []  # the plan chooses among the cps the strategy, heads and sequence allow
    if par.cp < 1:
        return [Problem("parallel.cp", par.cp, "must be >= 1 (the ranks one sequence is split over)", "use parallel.cp=1 for no context parallelism")]
    if par.cp == 1:
        if par.cp_kind not in (ContextParallelKind.auto,):
            return [Problem("parallel.cp_kind", par.cp_kind.value, "is set but parallel.cp=1 splits nothing", "set parallel.cp to the ranks each sequence is split over (e.g. parallel.cp=2), or drop parallel.cp_kind")]
        return []
    row = strategy_row(par.strategy)
    if not row.cp_kinds:
        return [Problem("parallel.cp", par.cp, f"parallel={par.name} has no context parallelism: {row.cp_off}", f"use {kinds_that_run()} with parallel.cp={par.cp}, or parallel.cp=1")]
    found = []
    if par.cp_kind != ContextParallelKind.auto and par.cp_kind.value not in row.cp_kinds:
        reason = row.cp_off or f"parallel={par.name} runs {', '.join(row.cp_kinds)}"
        found.append(Problem("parallel.cp_kind", par.cp_kind.value, f"does not run under parallel={par.name}: {reason}", f"use parallel.cp_kind=auto ({row.cp_kinds[0]} here)"))
    found += head_problems(par.cp, m.num_heads, m.num_kv_heads, m.name, pretrained=bool(m.pretrained))
    if not row.deepspeed and importlib.util.find_spec("deepspeed") is None:
        found.append(Problem("parallel.cp", par.cp, f"Ulysses is DeepSpeed's (deepspeed.runtime.sequence_parallel), also under parallel={par.name}, and DeepSpeed is not installed", "pip install 'tinytrain-llm[deepspeed]'"))
    seq = cfg.data.seq_len
    if seq % par.cp:
        found.append(Problem("data.seq_len", seq, f"must be a multiple of parallel.cp({par.cp}): each of the {par.cp} ranks holds an equal share of every sequence", f"use data.seq_len={seq - seq % par.cp or par.cp}"))
    d = cfg.data
    if d.format != DataFormat.text and not d.sources and d.pad_to_multiple_of % par.cp:
        # Fine-tuning batches are padded to their longest row, rounded up to this multiple.
        found.append(Problem("data.pad_to_multiple_of", d.pad_to_multiple_of, f"must be a multiple of parallel.cp({par.cp}): fine-tuning rows are padded to a multiple of it, and each of the {par.cp} ranks takes an equal share of a row", f"use data.pad_to_multiple_of={par.cp * max(1, d.pad_to_multiple_of // par.cp)}"))
    if cfg.finetune.objective != Objective.sft:
        found.append(Problem("finetune.objective", cfg.finetune.objective.value, f"is not built for parallel.cp={par.cp}: a pair's log-probabilities would need summing across the cp group", "use parallel.cp=1 for preference tuning (pairs are rarely long), or finetune.objective=sft"))
    if cfg.trainer.batch_size_warmup.start is not None:
        found.append(Problem("trainer.batch_size_warmup.start", cfg.trainer.batch_size_warmup.start, f"a batch warm-up grows the micro batch, and Ulysses' attention is built for one micro batch size (parallel.cp={par.cp})", "drop the warm-up (trainer.batch_size_warmup.start=null) for a context-parallel run, or parallel.cp=1"))
    if m.attention == Attention.eager:
        found.append(Problem("model.attention", "eager", f"cannot run under parallel.cp={par.cp}: Ulysses hands attention the whole sequence without a 4-D mask, which eager attention needs (O(seq^2) memory)", "use model.attention=auto (SDPA or a varlen kernel)"))
    return found


def head_problems(cp: int, heads: int, kv_heads: int, model_name: str, *, pretrained: bool) -> list[Problem]:
    """Ulysses gives each rank heads / cp query heads and kv_heads / cp key/value heads (kv heads are
    replicated when cp is a multiple of them): DeepSpeed's own rule, checked before any work."""
    if heads < 1 or kv_heads < 1:
        return []  # plan/families.py's model_problems names them
    where = "model.pretrained's" if pretrained else f"model={model_name}'s"
    found = []
    if heads % cp:
        found.append(Problem("parallel.cp", cp, f"cp({cp}) must divide num_heads({heads}) of {where} config: Ulysses gives each rank whole heads", f"use a cp that divides {heads}"))
    if kv_heads % cp and cp % kv_heads:
        found.append(Problem("parallel.cp", cp, f"cp({cp}) and num_kv_heads({kv_heads}) of {where} config must divide one another: Ulysses splits (or replicates) whole key/value heads", f"use a cp that divides {kv_heads}, or a multiple of it"))
    return found


def choose(cfg, cp: int, cp_reason: str = "") -> ContextPlan:
    """The kind of split for the plan's `cp` (`cp_reason`: why that cp, when the plan chose it)."""
    par, seq = cfg.parallel, cfg.data.seq_len
    chosen = f"{cp_reason}; " if cp_reason else ""
    if cp == 1:
        return ContextPlan(1, "none", chosen + "every rank holds whole sequences", seq)
    row = strategy_row(par.strategy)
    kind = row.cp_kinds[0] if par.cp_kind == ContextParallelKind.auto else par.cp_kind.value
    why = f"as configured (parallel.cp_kind={kind})" if par.cp_kind != ContextParallelKind.auto else f"auto: parallel={par.name} runs {kind}"
    if kind == "ulysses":
        why += f"; all-to-all of heads: each rank attends over all {seq} tokens with {cfg.model.num_heads // cp} of {cfg.model.num_heads} heads"
    return ContextPlan(cp, kind, chosen + why, seq // cp, ENGINES[kind], PROVEN[kind])


def allowed_cps(cfg, world: int) -> list[int]:
    """Powers of two up to world / tp that the layout, heads and sequence allow (Ulysses' rules)."""
    tp = cfg.parallel.tp
    found, c = [], 1
    while c <= world // tp:
        if (world // tp) % c == 0 and ulysses_splits(cfg, c):
            found.append(c)
        c *= 2
    return found


def ulysses_splits(cfg, cp: int) -> bool:
    """Ulysses' rules for a cp, the world aside: whole heads per rank (query heads divisible by cp;
    kv heads divisible by cp, or replicated when cp is a multiple of them), and a sequence (and a
    fine-tuning batch's padding) that cp divides."""
    m, d = cfg.model, cfg.data
    heads = m.num_heads % cp == 0 and (m.num_kv_heads % cp == 0 or cp % m.num_kv_heads == 0)
    padded = d.format == DataFormat.text or d.sources or d.pad_to_multiple_of % cp == 0
    return heads and d.seq_len % cp == 0 and bool(padded)


def decide_cp(cfg, world: int, activations_at, *, state_bytes: float, gpu_memory_gb: float | None) -> tuple[int, str]:
    """parallel.cp as configured, or for null the smallest allowed cp whose activations fit the GPU
    beside the model states; (cp, why) with why empty when configured."""
    par = cfg.parallel
    if par.cp is not None:
        return par.cp, ""
    row = strategy_row(par.strategy)
    if not row.cp_kinds:
        return 1, f"parallel.cp=null: 1, since parallel={par.name} has no context parallelism"
    if cfg.finetune.objective != Objective.sft:
        return 1, "parallel.cp=null: 1, since preference objectives run whole sequences"
    if not gpu_memory_gb:
        return 1, "parallel.cp=null: 1, no GPU memory to size the context against (plan with hardware.gpu=...)"
    gpu, seq = gpu_memory_gb * 1e9, cfg.data.seq_len
    options = allowed_cps(cfg, world)
    for c in options:
        need = state_bytes + activations_at(seq, c)
        if need <= AUTO_MARGIN * gpu:
            return c, f"parallel.cp=null: {c}, the smallest cp whose estimate fits with a {1 - AUTO_MARGIN:.0%} margin ({need / GIB:.1f} of {gpu / GIB:.1f} GiB)"
    return options[-1], f"parallel.cp=null: {options[-1]}, the largest this world allows; none fits"


def longest_context(activations_at, *, state_bytes: float, gpu_bytes: float, cp: int) -> int:
    """The longest seq_len (a multiple of CONTEXT_STEP x cp) whose activations at that cp, with the
    model states, fit `gpu_bytes`; 0 when not even one step does. `activations_at(seq, cp)` -> bytes."""
    step = CONTEXT_STEP * cp
    lo, hi = 0, LONGEST_SEARCHED // step
    while lo < hi:  # activations grow with the sequence: the largest k with k x step fitting
        mid = (lo + hi + 1) // 2
        if state_bytes + activations_at(mid * step, cp) <= gpu_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def with_longest(cfg, context: ContextPlan, activations_at, *, state_bytes: float, gpu_memory_gb: float | None) -> ContextPlan:
    """The longest data.seq_len that fits at the planned cp, and at twice it where Ulysses allows that."""
    if not gpu_memory_gb:
        return context
    gpu = gpu_memory_gb * 1e9
    cps = (context.cp, 2 * context.cp) if ulysses_splits(cfg, 2 * context.cp) else (context.cp,)
    longest = tuple((c, longest_context(activations_at, state_bytes=state_bytes, gpu_bytes=gpu, cp=c)) for c in cps)
    return ContextPlan(**{**asdict(context), "longest": longest})


def fit_problem(cfg, context: ContextPlan, memory, activations_at, *, world: int, checkpointing: str = "none") -> None:
    """A context that does not fit, while the model states alone would, is refused naming the cp that fits."""
    if not context.longest or memory.fits is not False:
        return
    seq = cfg.data.seq_len
    states_gib = memory.params_gib + memory.grads_gib + memory.optimizer_gib + memory.reference_gib
    if states_gib >= memory.gpu_memory_gib:
        return  # the model itself does not fit: the memory line's note says what to change
    tp = cfg.parallel.tp
    room = memory.gpu_memory_gib * GIB - states_gib * GIB
    # cp in powers of two that Ulysses allows (the same rules as allowed_cps), the first whose activations fit
    larger = [c for c in (context.cp * 2**k for k in range(1, 8)) if ulysses_splits(cfg, c)]
    fitting = next((c for c in larger if activations_at(seq, c) <= room), None)
    here = context.longest_at(context.cp)
    if fitting is None:
        fix = f"use data.seq_len <= {here}"
    elif world % (tp * fitting) == 0:
        fix = f"use parallel.cp={fitting}"
    else:
        fix = f"use parallel.cp={fitting} on {tp * fitting} GPUs or a multiple (tp {tp} x cp {fitting}; this run has {world})"
    if not strategy_row(cfg.parallel.strategy).cp_kinds and fitting:
        fix += f" with {kinds_that_run()}"
    need = f"{memory.total_gib:.1f} GiB needed per GPU, {memory.gpu_memory_gib:.1f} GiB on the GPU"
    others = ([] if checkpointing == "full" else ["trainer.activation_checkpointing=full"]) + ([f"a smaller trainer.micro_batch_size (now {cfg.trainer.micro_batch_size})"] if memory_micro_batch(cfg) > 1 else [])
    fix += "".join(f"; or {o}" for o in others)
    raise ConfigError(Problem("data.seq_len", seq, f"does not fit at parallel.cp={context.cp}: {need} (activations {memory.activations_gib:.1f} GiB); the longest that fits is {here}", fix))


def memory_micro_batch(cfg) -> int:
    """1 under trainer.micro_batch_size=auto, which chose the largest that fits already."""
    value = cfg.trainer.micro_batch_size
    return value if isinstance(value, int) else 1


def render(c: dict, seq_len: int) -> list[str]:
    if c["cp"] == 1:
        line = f"context    cp 1: {c['reason']} of {seq_len} tokens"
    else:
        line = f"context    cp {c['cp']} ({c['kind']}, {c['engine']}): {c['reason']}; each rank holds {c['local_seq_len']} of {seq_len} tokens between attention calls"
    lines = [line]
    if c["cp"] > 1:
        lines.append(f"           proven: {c['proven']}")
    if c["longest"]:
        fits = ", ".join(f"{longest} at cp {cp}" for cp, longest in c["longest"].items())
        lines.append(f"           longest data.seq_len that fits the GPU (this layout's model states): {fits}")
    return lines

"""Long context: how `parallel.cp` splits each micro batch's sequence, and the longest context that fits.

With cp > 1 the ranks of a cp group share one micro batch: each holds seq_len / cp of its tokens
between attention calls, and attention sees the whole sequence through the engine the strategy
runs (plan/parallel.py's `cp_kinds`): DeepSpeed's Ulysses under the ZeRO strategies and under
fsdp_tp with tp 1 (an all-to-all trades the sequence split for a head split, so every rank attends
over all tokens with heads / cp heads); torch's ring under fsdp_tp where Ulysses cannot split (tp > 1,
heads that cp does not divide, or no DeepSpeed installed: each rank's queries attend to keys and
values gathered over the cp group). Data parallelism is world / (tp x cp) (plan/layout.py).

The planner owns activation memory as a function of seq_len, cp, micro batch and activation
checkpointing (plan/memory.py), so it can print the longest `data.seq_len` that fits the GPU for
the planned layout and for twice its cp, and refuse a context that does not fit, naming the cp that
would.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass

from tinytrain.config.schema import Attention, CompileMode, ContextParallelKind, DataFormat, Objective
from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.extras import installed
from tinytrain.plan.layout import world_size
from tinytrain.plan.levers import read_mode
from tinytrain.plan.memory import GIB
from tinytrain.plan.micro_batch import SAFETY_MARGIN, is_auto
from tinytrain.plan.parallel import STRATEGIES, finetune_refuses, power_of_two_divisors, strategy_row


@dataclass(frozen=True)
class Kind:
    """One kind of sequence split: what runs it, and where it was proven."""

    engine: str
    proven: str


# Printed in the plan and docs/parallelism.md, "Long context".
KINDS = {
    "ulysses": Kind(
        "DeepSpeed's UlyssesSPAttentionHF (deepspeed.runtime.sequence_parallel.ulysses_sp)",
        "equal to cp=1 in loss and gradients on CPU over gloo (tests/integration/test_context_parallel.py); not yet on GPUs",
    ),
    "ring": Kind(
        "torch's context parallel, flex-attention path (torch.distributed.tensor.experimental: head-tail load balancing, keys and values all-gathered over cp)",
        "equal to cp=1 in loss and gradients on CPU over gloo with packed documents, its kernel there SDPA over the same block mask "
        "(tests/integration/test_ring_attention.py, test_context_parallel.py); the GPU's compiled flex kernel not yet (benchmarks/gpu_check.py part e)",
    ),
}
# DeepSpeed's Ulysses exchange inside compiled layers: before this release dynamo traced its
# autograd function's forward (an all_to_all into an empty tensor) as carrying no data from its
# input, so q, k and v got no gradient at all, silently (DeepSpeed PR 8491, in 0.19.7).
ULYSSES_COMPILED_FIXED_IN = "0.19.7"
# torch's cp block mask splits the sequence in blocks of this many tokens per rank (flex attention's).
RING_BLOCK = 128
# The longest context is searched in steps of this many tokens per cp rank.
CONTEXT_STEP = 1024
LONGEST_SEARCHED = 1 << 24  # 16M tokens
# parallel.cp=null picks a cp whose estimate stays under this share of the GPU, as the other autos
# do (plan/micro_batch.py): the estimate does not count the allocator's fragmentation,
# communication buffers or the CUDA context.
AUTO_MARGIN = 1 - SAFETY_MARGIN


@dataclass(frozen=True)
class ContextPlan:
    cp: int
    kind: str  # "none" (cp 1), "ulysses", "ring"
    reason: str
    local_seq_len: int  # the tokens of one sequence a rank holds between attention calls
    engine: str = ""
    proven: str = ""
    longest: tuple = ()  # ((cp, longest data.seq_len that fits), ...) for cp and 2 x cp; () without GPU memory
    longest_gpus: tuple = ()  # ((cp, GPUs), ...) for a cp of `longest` that needs more GPUs than the run has
    positions: int | None = None  # the positions the model covers (RoPE scaling included): beyond them a longest fits memory only
    scaled: bool = False  # whether `positions` counts a RoPE scaling already

    def longest_at(self, cp: int) -> int | None:
        return dict(self.longest).get(cp)

    def to_dict(self) -> dict:
        return {**asdict(self), "longest": {str(cp): seq for cp, seq in self.longest}, "longest_gpus": {str(cp): gpus for cp, gpus in self.longest_gpus}}


def kinds_that_run(cfg=None) -> str:
    """The parallel presets (conf/parallel/*.yaml) whose strategy splits sequences, and that this
    run's fine-tuning method runs on (`cfg`; finetune=qlora runs on none of them): "" when none."""
    from omegaconf import OmegaConf

    from tinytrain.config import CONF_DIR

    runs = {s.value for s, r in STRATEGIES.items() if r.cp_kinds}
    presets = {p.stem: OmegaConf.load(p) for p in sorted((CONF_DIR / "parallel").glob("*.yaml"))}
    names = [n for n, p in presets.items() if p.strategy in runs and (cfg is None or not finetune_refuses(OmegaConf.merge(cfg, {"parallel": p})))]
    return "parallel=" + "|".join(names) if names else ""


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
        kinds = kinds_that_run(cfg)
        fix = f"use {kinds} with parallel.cp={par.cp}, or parallel.cp=1" if kinds else f"use parallel.cp=1 (finetune={cfg.finetune.method.value} runs on no strategy that splits sequences)"
        return [Problem("parallel.cp", par.cp, f"parallel={par.name} has no context parallelism: {row.cp_off}", fix)]
    kind, why = choose_kind(cfg, par.cp)
    if kind not in row.cp_kinds:
        # The fix changes the kind: the other kind's rules are the ones to meet then, not this one's.
        return [Problem("parallel.cp_kind", kind, f"does not run under parallel={par.name}: parallel={par.name} runs {', '.join(row.cp_kinds)}", f"use parallel.cp_kind=auto ({row.cp_kinds[0]} here)")]
    if kind == "ring":
        return ring_problems(cfg, par.cp, why)
    ranks = world_size(cfg) // max(par.tp, 1)
    ring = "ring" in row.cp_kinds  # parallel.cp_kind=ulysses set where auto would take ring past the heads
    found = head_problems(par.cp, m.num_heads, m.num_kv_heads, m.name, pretrained=bool(m.pretrained), ranks=ranks, ring=ring)
    compiled = ulysses_compile_blocker(cfg)
    if compiled:
        ring = ", or parallel.cp_kind=ring" if "ring" in row.cp_kinds else ""
        found.append(Problem("trainer.compile", cfg.trainer.compile, f"cannot run with Ulysses (parallel.cp={par.cp}): {compiled}", f"pip install 'deepspeed>={ULYSSES_COMPILED_FIXED_IN}', or trainer.compile=none{ring}"))
    if not row.deepspeed and par.tp > 1:
        # DeepSpeed's Ulysses groups are consecutive ranks, which the tensor-parallel groups take.
        # Reached with parallel.cp_kind=ulysses only: auto takes ring here (choose_kind).
        found.append(Problem("parallel.cp_kind", par.cp_kind.value, f"Ulysses under fsdp_tp runs with tp 1 (this run: tp {par.tp}, parallel.cp={par.cp}): its groups of consecutive ranks are the tensor-parallel groups", f"use parallel.cp_kind=auto (ring, which runs beside tp {par.tp}), or parallel.tp=1 with parallel.cp, or parallel=zero3 (parameters partitioned) with parallel.cp"))
    if not row.deepspeed and not installed("deepspeed"):
        found.append(Problem("parallel.cp", par.cp, f"Ulysses is DeepSpeed's (deepspeed.runtime.sequence_parallel), also under parallel={par.name}, and DeepSpeed is not installed", "pip install 'tinytrain-llm[deepspeed]'"))
    seq = cfg.data.seq_len
    if seq % par.cp:
        found.append(Problem("data.seq_len", seq, f"must be a multiple of parallel.cp({par.cp}): each of the {par.cp} ranks holds an equal share of every sequence", f"use data.seq_len={seq - seq % par.cp or par.cp}"))
    found += shared_problems(cfg, par.cp)
    if cfg.trainer.batch_size_warmup.start is not None:
        found.append(Problem("trainer.batch_size_warmup.start", cfg.trainer.batch_size_warmup.start, f"a batch warm-up grows the micro batch, and Ulysses' attention is built for one micro batch size (parallel.cp={par.cp})", "drop the warm-up (trainer.batch_size_warmup.start=null) for a context-parallel run, or parallel.cp=1"))
    if m.attention == Attention.eager:
        found.append(eager_problem(par.cp))
    return found


def ring_problems(cfg, cp: int, why: str) -> list[Problem]:
    return ring_block_problems(cfg, cp, why) + shared_problems(cfg, cp)


def ring_block_problems(cfg, cp: int, why: str) -> list[Problem]:
    """Ring splits flex attention's blocks: every row a multiple of cp x RING_BLOCK tokens."""
    d, unit = cfg.data, cp * RING_BLOCK
    found = []
    if d.seq_len % unit:
        found.append(Problem("data.seq_len", d.seq_len, f"must be a multiple of parallel.cp({cp}) x {RING_BLOCK} for ring ({why}): torch's context parallel splits flex attention's {RING_BLOCK}-token blocks over the cp ranks", f"use data.seq_len={max(1, d.seq_len // unit) * unit}"))
    if padded_rows(d) and d.pad_to_multiple_of % unit:
        found.append(Problem("data.pad_to_multiple_of", d.pad_to_multiple_of, f"must be a multiple of parallel.cp({cp}) x {RING_BLOCK} for ring: fine-tuning rows are padded to a multiple of it, and ring splits {RING_BLOCK}-token blocks over the cp ranks", f"use data.pad_to_multiple_of={unit}"))
    return found


def padded_rows(d) -> bool:
    """Fine-tuning rows, padded to their batch's longest (rounded up to data.pad_to_multiple_of)."""
    return d.format != DataFormat.text and not d.sources


def shared_problems(cfg, cp: int) -> list[Problem]:
    """What every kind of split needs: padded fine-tuning rows that cp divides, an objective whose
    loss is a mean over tokens."""
    found, d = [], cfg.data
    if padded_rows(d) and d.pad_to_multiple_of % cp:
        # Fine-tuning batches are padded to their longest row, rounded up to this multiple.
        found.append(Problem("data.pad_to_multiple_of", d.pad_to_multiple_of, f"must be a multiple of parallel.cp({cp}): fine-tuning rows are padded to a multiple of it, and each of the {cp} ranks takes an equal share of a row", f"use data.pad_to_multiple_of={cp * max(1, d.pad_to_multiple_of // cp)}"))
    if cfg.finetune.objective != Objective.sft:
        found.append(Problem("finetune.objective", cfg.finetune.objective.value, f"is not built for parallel.cp={cp}: a pair's log-probabilities would need summing across the cp group", "use parallel.cp=1 for preference tuning (pairs are rarely long), or finetune.objective=sft"))
    return found


def head_problems(cp: int, heads: int, kv_heads: int, model_name: str, *, pretrained: bool, ranks: int, ring: bool = False) -> list[Problem]:
    """Ulysses gives each rank heads / cp query heads and kv_heads / cp key/value heads (kv heads are
    replicated when cp is a multiple of them): DeepSpeed's own rule, checked before any work. The fix
    lists the cps that meet both rules and divide the `ranks` (world / tp) at once; `ring`: the
    strategy runs ring too, which splits any heads."""
    if heads < 1 or kv_heads < 1:
        return []  # plan/families.py's model_problems names them
    where = "model.pretrained's" if pretrained else f"model={model_name}'s"
    fix = ulysses_cp_fix(heads, kv_heads, ranks, ring=ring)
    found = []
    if heads % cp:
        found.append(Problem("parallel.cp", cp, f"cp({cp}) must divide num_heads({heads}) of {where} config: Ulysses gives each rank whole heads", fix))
    if kv_heads % cp and cp % kv_heads:
        found.append(Problem("parallel.cp", cp, f"cp({cp}) and num_kv_heads({kv_heads}) of {where} config must divide one another: Ulysses splits (or replicates) whole key/value heads", fix))
    return found


def whole_head_cps(heads: int, kv_heads: int, ranks: int) -> list[int]:
    """The cps above 1 that divide `ranks` (world / tp) and give every rank whole heads: cp divides
    num_heads, and cp and num_kv_heads divide one another."""
    return [c for c in range(2, ranks + 1) if ranks % c == 0 and heads % c == 0 and (kv_heads % c == 0 or c % kv_heads == 0)]


def ulysses_cp_fix(heads: int, kv_heads: int, ranks: int, *, ring: bool) -> str:
    cps = whole_head_cps(heads, kv_heads, ranks)
    why = f"the cps that divide num_heads({heads}), divide or are a multiple of num_kv_heads({kv_heads}), and divide the world / tp ({ranks})"
    ulysses = f"parallel.cp={' or '.join(map(str, cps))} ({why})" if cps else f"parallel.cp=1 (no cp above 1 divides num_heads({heads}), divides or is a multiple of num_kv_heads({kv_heads}), and divides the world / tp ({ranks}))"
    return "use " + ("parallel.cp_kind=auto (ring, which splits any heads), or " if ring else "") + ulysses


def ulysses_blockers(cfg, cp: int) -> list[str]:
    """Why Ulysses cannot split this run's sequences over `cp` ranks ([]: it can)."""
    par = cfg.parallel
    outside_deepspeed = not strategy_row(par.strategy).deepspeed
    tp = [f"tp {par.tp} takes the consecutive ranks its groups need under parallel={par.name}"] if outside_deepspeed and par.tp > 1 else []
    # Under fsdp_tp Ulysses is still DeepSpeed's; ring is torch's own.
    missing = ["DeepSpeed, whose Ulysses it is, is not installed"] if outside_deepspeed and not installed("deepspeed") else []
    compiled = ulysses_compile_blocker(cfg)
    return tp + missing + ([compiled] if compiled else []) + head_blockers(cfg.model, cp)


@functools.cache
def deepspeed_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("deepspeed")
    except importlib.metadata.PackageNotFoundError:
        return None


def ulysses_compile_blocker(cfg) -> str | None:
    """Why this DeepSpeed's Ulysses cannot run in this run's compiled blocks (None: it can)."""
    if read_mode(cfg.trainer.compile, CompileMode) in (None, CompileMode.none):
        return None
    version = deepspeed_version()
    if version is None:
        return None
    from packaging.version import Version

    if Version(version) >= Version(ULYSSES_COMPILED_FIXED_IN):
        return None
    return f"DeepSpeed {version}'s Ulysses exchange gives compiled layers no gradient for q, k and v (fixed in DeepSpeed {ULYSSES_COMPILED_FIXED_IN})"


def head_blockers(m, cp: int) -> list[str]:
    found = []
    if m.num_heads % cp:
        found.append(f"cp({cp}) does not divide num_heads({m.num_heads})")
    if m.num_kv_heads % cp and cp % m.num_kv_heads:
        found.append(f"cp({cp}) and num_kv_heads({m.num_kv_heads}) do not divide one another")
    return found


def choose_kind(cfg, cp: int) -> tuple[str, str]:
    """(kind, why) for cp > 1: as configured, or for auto the strategy's first kind (Ulysses) unless
    it cannot split this run, then ring where the strategy runs it."""
    par = cfg.parallel
    if par.cp_kind != ContextParallelKind.auto:
        return par.cp_kind.value, f"as configured (parallel.cp_kind={par.cp_kind.value})"
    kinds = strategy_row(par.strategy).cp_kinds
    blockers = ulysses_blockers(cfg, cp)
    if blockers and "ring" in kinds:
        return "ring", "auto: ring, since Ulysses cannot: " + "; ".join(blockers)
    if len(kinds) > 1:
        return kinds[0], f"auto: {kinds[0]}, since tp {par.tp} and cp({cp}) splits whole heads (ring where they do not)"
    return kinds[0], f"auto: parallel={par.name} runs {kinds[0]}"


def is_ring(cfg, cp: int) -> bool:
    """Whether the plan splits sequences over `cp` ranks by ring (what the activation count asks)."""
    return cp > 1 and bool(strategy_row(cfg.parallel.strategy).cp_kinds) and choose_kind(cfg, cp)[0] == "ring"


def choose(cfg, cp: int, cp_reason: str = "") -> ContextPlan:
    """The kind of split for the plan's `cp` (`cp_reason`: why that cp, when the plan chose it)."""
    seq = cfg.data.seq_len
    chosen = f"{cp_reason}; " if cp_reason else ""
    if cp == 1:
        return ContextPlan(1, "none", chosen + "every rank holds whole sequences", seq)
    kind, why = choose_kind(cfg, cp)
    if kind == "ulysses":
        why += f"; all-to-all of heads: each rank attends over all {seq} tokens with {cfg.model.num_heads // cp} of {cfg.model.num_heads} heads"
    else:
        why += f"; each rank's queries attend over all {seq} tokens, keys and values gathered over the cp group"
    return ContextPlan(cp, kind, chosen + why, seq // cp, KINDS[kind].engine, KINDS[kind].proven)


def allowed_cps(cfg, world: int) -> list[int]:
    """Powers of two up to world / tp that the layout, heads and sequence allow (`splits`)."""
    return [c for c in power_of_two_divisors(world // cfg.parallel.tp) if splits(cfg, c)]


def splits(cfg, cp: int) -> bool:
    """Whether a kind this run may use (parallel.cp_kind, or for auto any its strategy runs) splits
    its sequences over `cp` ranks, the world aside: the cps the plan may choose or suggest. A strategy
    without context parallelism is asked Ulysses' rules: the fix names the presets that run it."""
    if cp == 1:
        return True
    wanted = cfg.parallel.cp_kind
    kinds = strategy_row(cfg.parallel.strategy).cp_kinds or ("ulysses",)
    ulysses = wanted in (ContextParallelKind.auto, ContextParallelKind.ulysses) and "ulysses" in kinds and ulysses_splits(cfg, cp)
    ring = wanted in (ContextParallelKind.auto, ContextParallelKind.ring) and "ring" in kinds and ring_splits(cfg, cp)
    return ulysses or ring


def ulysses_splits(cfg, cp: int) -> bool:
    """Ulysses' rules for a cp: whole heads per rank (query heads divisible by cp; kv heads divisible
    by cp, or replicated when cp is a multiple of them), tp 1 under fsdp_tp, and a sequence (and a
    fine-tuning batch's padding) that cp divides."""
    d = cfg.data
    padded = not padded_rows(d) or d.pad_to_multiple_of % cp == 0
    return (cp == 1 or not ulysses_blockers(cfg, cp)) and d.seq_len % cp == 0 and padded


def ring_splits(cfg, cp: int) -> bool:
    """Ring's rules for a cp: a sequence (and a fine-tuning batch's padding) in whole blocks per rank."""
    return not ring_block_problems(cfg, cp, "a cp the plan may choose")


def decide_cp(cfg, world: int, needed_at, *, gpu_memory_gb: float | None, lays_out=lambda cp: True) -> tuple[int, str]:
    """parallel.cp as configured, or for null the smallest allowed cp whose step fits the GPU
    (`needed_at(seq, cp)` -> bytes per GPU, states and activations) and that lays out the global
    batch (`lays_out(cp)`: its data parallelism, world / (tp x cp), divides it); (cp, why) with why
    empty when configured."""
    par = cfg.parallel
    if par.cp is not None:
        return par.cp, ""
    row = strategy_row(par.strategy)
    if not row.cp_kinds:
        return 1, f"parallel.cp=null: 1, since parallel={par.name} has no context parallelism"
    if cfg.finetune.objective != Objective.sft:
        return 1, "parallel.cp=null: 1, since preference objectives run whole sequences"
    options = allowed_cps(cfg, world)
    batched = [c for c in options if lays_out(c)] or options  # none: the batch's problem is named at cp 1
    if not gpu_memory_gb:
        cp, why = batched[0], "no GPU memory to size the context against (plan with hardware.gpu=...)"
        return cp, f"parallel.cp=null: {cp}, {why}{batch_note(cfg, world, options, cp, None)}"
    gpu, seq = gpu_memory_gb * 1e9, cfg.data.seq_len

    def fits(c: int) -> bool:
        return needed_at(seq, c) <= AUTO_MARGIN * gpu

    cp = next((c for c in batched if fits(c)), None)
    if cp is None:
        return batched[-1], f"parallel.cp=null: {batched[-1]}, the largest this world allows; none fits"
    need = needed_at(seq, cp)
    sized = " at micro batch 1; trainer.micro_batch_size=auto chooses its own after cp: the memory line" if is_auto(cfg.trainer.micro_batch_size) else ""
    why = f"the smallest cp whose estimate fits with a {1 - AUTO_MARGIN:.0%} margin ({need / GIB:.1f} of {gpu / GIB:.1f} GiB{sized})"
    return cp, f"parallel.cp=null: {cp}, {why}{batch_note(cfg, world, options, cp, fits)}"


def batch_note(cfg, world: int, options: list[int], chosen: int, fits) -> str:
    """Why a smaller cp (that fits; `fits` None: not known) was passed over: its data parallelism
    (world / (tp x cp)) does not divide the global batch. Empty when none was."""
    passed = [c for c in options if c < chosen and (fits is None or fits(c))]
    if not passed:
        return ""
    dps = ", ".join(str(world // (cfg.parallel.tp * c)) for c in passed)
    would = "" if fits is None else " would fit but"
    return f"; cp {', '.join(map(str, passed))}{would} cannot lay out trainer.global_batch_size={cfg.trainer.global_batch_size} (data parallel {dps})"


def longest_context(needed_at, *, gpu_bytes: float, cp: int, step: int | None = None) -> int:
    """The longest seq_len (a multiple of `step`, by default CONTEXT_STEP x cp) whose step at that cp
    fits `gpu_bytes`; 0 when not even one step does. `needed_at(seq, cp)` -> bytes per GPU, states
    and activations."""
    step = step or CONTEXT_STEP * cp
    lo, hi = 0, LONGEST_SEARCHED // step
    while lo < hi:  # activations grow with the sequence: the largest k with k x step fitting
        mid = (lo + hi + 1) // 2
        if needed_at(mid * step, cp) <= gpu_bytes:
            lo = mid
        else:
            hi = mid - 1
    return lo * step


def with_longest(cfg, context: ContextPlan, needed_at, *, gpu_memory_gb: float | None, world: int, positions: int | None = None, scaled: bool = False) -> ContextPlan:
    """The longest data.seq_len that fits at the planned cp, and at twice it where a kind splits that
    (on tp x 2cp GPUs where that is more than the run has: `needed_at` counts their model states)."""
    if not gpu_memory_gb:
        return context
    gpu = gpu_memory_gb * 1e9
    cps = (context.cp, 2 * context.cp) if splits(cfg, 2 * context.cp) else (context.cp,)
    longest = tuple((c, longest_context(needed_at, gpu_bytes=gpu, cp=c)) for c in cps)
    more = tuple((c, cfg.parallel.tp * c) for c in cps if cfg.parallel.tp * c > world)
    return ContextPlan(**{**asdict(context), "longest": longest, "longest_gpus": more, "positions": positions, "scaled": scaled})


def fit_problem(cfg, context: ContextPlan, memory, needed_at, *, world: int, checkpointing: str = "none", states_levers: tuple = ()) -> None:
    """A context that does not fit, while the model states alone would, is refused naming what
    fits: a larger cp on this world; else a sequence such a cp splits, a cp on more GPUs (whose
    model states ZeRO or FSDP partition further), a shorter sequence. Where no sequence fits (the
    states and what the step holds beside them fill the GPU) the refusal says so, naming
    `states_levers` (plan/memory.py's memory_levers that lower the states) and the larger layouts
    that fit. The cps named are on strategies this run's fine-tuning method runs on."""
    if not context.longest or memory.fits is not False:
        return
    seq = cfg.data.seq_len
    if memory.states_overflow:
        return  # the model itself does not fit: the memory line's note says what to change
    tp, gpu = cfg.parallel.tp, memory.gpu_memory_gib * GIB
    here = context.longest_at(context.cp) or longest_context(needed_at, gpu_bytes=gpu, cp=context.cp, step=RING_BLOCK * context.cp)
    runs_cp = bool(strategy_row(cfg.parallel.strategy).cp_kinds)
    kinds = "" if runs_cp else kinds_that_run(cfg)
    split = runs_cp or bool(kinds)  # a cp above 1 is a fix this run can take
    kinds = f" with {kinds}" if kinds else ""
    same = fitting_layout(cfg, context.cp, needed_at, world=world, gpus_tried=[world], gpu_bytes=gpu) if split else None
    more = fitting_layout(cfg, context.cp, needed_at, world=world, gpus_tried=[world * 2**k for k in range(1, 8)], gpu_bytes=gpu, larger_cp=split)
    need = f"{memory.total_gib:.1f} GiB needed per GPU, {memory.gpu_memory_gib:.1f} GiB on the GPU"
    if not here and not same:
        # Not even the shortest sequence fits: the model states (and the step's gradients, gathered
        # weights and buffers beside them) are what overflow, and a shorter sequence cannot help.
        fixes = [*states_levers]
        if more:
            c, gpus = more
            fixes.insert(0, f"{gpus} GPUs (cluster.devices or cluster.nodes; tp {tp} x cp {c} x dp {gpus // (tp * c)}; this run has {world})" + (f" with parallel.cp={c}{kinds}" if c > 1 else ""))
        fixes.append("a GPU with more memory (hardware.gpu)")
        at_zero = needed_at(0, context.cp) / GIB
        raise ConfigError(Problem("parallel", cfg.parallel.name, f"the model states, and what the step holds beside them (gradients, gathered weights, buffers), do not fit this GPU at any data.seq_len: {at_zero:.1f} GiB per GPU before any activations, {memory.gpu_memory_gib:.1f} GiB on the GPU (at data.seq_len={seq}: {need})", "use " + "; or ".join(dict.fromkeys(fixes))))
    if same:
        fixes = [f"parallel.cp={same[0]}{kinds}"]
    else:
        fixes = []
        unsplit = unsplit_cp(cfg, context.cp, needed_at, world=world, gpu_bytes=gpu) if split else None
        if unsplit:
            c, whole, unit = unsplit
            fixes.append(f"data.seq_len={whole} with parallel.cp={c}{kinds} (cp {c} splits a multiple of {unit}; {seq} it does not)")
        if more:
            c, gpus = more
            fixes.append(f"parallel.cp={c}{kinds} on {gpus} GPUs (tp {tp} x cp {c} x dp {gpus // (tp * c)}; this run has {world})")
        fixes.append(f"data.seq_len <= {here}")
    fixes += ([] if checkpointing == "full" else ["trainer.activation_checkpointing=full"]) + ([f"a smaller trainer.micro_batch_size (now {cfg.trainer.micro_batch_size})"] if memory_micro_batch(cfg) > 1 else [])
    at = f"parallel.cp={context.cp}" if cfg.parallel.cp is not None else f"cp {context.cp} (parallel.cp=null: the largest cp that splits it here)"
    raise ConfigError(Problem("data.seq_len", seq, f"does not fit at {at}: {need} (activations {memory.activations_gib:.1f} GiB); the longest that fits is {here}", "use " + "; or ".join(fixes)))


def fitting_layout(cfg, cp: int, needed_at, *, world: int, gpus_tried: list[int], gpu_bytes: float, larger_cp: bool = True) -> tuple[int, int] | None:
    """(cp, GPUs) of the first layout that fits, in the order of `gpus_tried` (GPU counts), and on
    each the smallest cp that a kind splits: above the run's on the run's `world`, from the run's on
    a larger one (`larger_cp` False: the run's cp only, where no strategy it can take splits more)."""
    tp = cfg.parallel.tp
    for gpus in gpus_tried:
        for c in power_of_two_divisors(gpus // tp) if larger_cp else [cp]:
            larger = c > cp if gpus == world else c >= cp
            if larger and splits(cfg, c) and needed_at(cfg.data.seq_len, c, gpus) <= gpu_bytes:
                return c, gpus
    return None


def unsplit_cp(cfg, cp: int, needed_at, *, world: int, gpu_bytes: float) -> tuple[int, int, int] | None:
    """(cp, data.seq_len, unit) for the smallest larger cp on this world that would fit a sequence
    of whole units of it (rounded up where that fits, else down) but does not split this
    data.seq_len: the sequence, not the memory or the heads, is what stops it. The unit is the
    smallest a kind this run may use splits: cp tokens for Ulysses, cp x RING_BLOCK for ring."""
    from omegaconf import OmegaConf

    seq, tp = cfg.data.seq_len, cfg.parallel.tp
    for c in power_of_two_divisors(world // tp):
        if c <= cp or splits(cfg, c):
            continue
        for unit in (c, c * RING_BLOCK):
            if seq < unit:
                continue
            up, down = -(-seq // unit) * unit, seq // unit * unit
            for whole in (up, down):
                if needed_at(whole, c, world) <= gpu_bytes and splits(OmegaConf.merge(cfg, {"data": {"seq_len": whole}}), c):
                    return c, whole, unit
    return None


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
        gpus = c.get("longest_gpus", {})
        fits = ", ".join(f"{longest} at cp {cp}" + (f" on {gpus[cp]} GPUs" if cp in gpus else "") for cp, longest in c["longest"].items())
        beyond = c.get("positions") and max(c["longest"].values()) > c["positions"]
        extend = "with its RoPE scaling; a larger model.rope_scaling.factor extends them" if c.get("scaled") else "model.rope_scaling would extend them"
        positions = f"; the model's positions reach {c['positions']} ({extend})" if beyond else ""
        lines.append(f"           longest data.seq_len that fits the GPU (this layout's model states): {fits}{positions}")
    return lines


def attention_problems(cp: int, kind: str, attention: str, family_name: str, softcap: bool, cp_reason: str = "") -> list[Problem]:
    """What the model's resolved attention (plan/attention.py, after the family's rules) cannot do
    under a split over `cp` ranks: validate checks the configured model.attention, and Gemma-2 gets
    eager from auto on a machine without flash-attn (its soft-capping has no SDPA path)."""
    if cp <= 1:
        return []
    chosen = f" ({cp_reason})" if cp_reason else ""
    if softcap and (kind == "ring" or attention != "flash_attention_2"):
        what = "ring's flex attention" if kind == "ring" else f"{attention} attention under Ulysses"
        return [Problem("parallel.cp", cp, f"{family_name}'s attention soft-capping is applied by flash-attn 2 alone under context parallelism, and this run would split sequences by {what}{chosen}", "use parallel.cp=1, or Ulysses (parallel.cp_kind=ulysses) with model.attention=flash_attention_2 on a GPU of compute capability >= 8.0 with flash-attn installed")]
    if kind == "ulysses" and attention == "eager":
        return [eager_problem(cp, chosen)]
    return []


def eager_problem(cp: int, chosen: str = "") -> Problem:
    """Eager attention under Ulysses: configured (validate) or resolved for the family (the plan)."""
    return Problem("model.attention", "eager", f"cannot run under parallel.cp={cp}{chosen}: Ulysses hands attention the whole sequence without a 4-D mask, which eager attention needs (O(seq^2) memory)", "use model.attention=auto (SDPA or a varlen kernel), or parallel.cp=1")

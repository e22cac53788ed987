"""finetune.objective=dpo|ipo|simpo|orpo|kto: the objective's settings, where the reference comes from, and
what holding it costs per GPU, decided once here (the model stage applies it:
tinytrain/model/preference_loss.py and tinytrain/model/reference.py).

Reference, by method: lora/qlora disable the adapters (nothing held); full fine-tuning holds a
frozen copy of the initial weights like the policy (fp32 beside AMP's fp32 weights on single, ddp,
fsdp_tp, sharded by tp x dp there; 16-bit under DeepSpeed, partitioned at ZeRO-3);
precompute_reference computes log-probs once before training (nothing held); simpo has none.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

from tinytrain.config.schema import DataFormat, FinetuneMethod, Objective, TrainOn
from tinytrain.errors import ConfigError, Problem
from tinytrain.plan import micro_batch
from tinytrain.plan.memory import GIB, StateLayout
from tinytrain.plan.parallel import strategy_row

ADAPTERS_OFF = "the base with the adapters disabled (no copy held)"
FROZEN_COPY = "a frozen copy of the initial weights, held like the policy"
PRECOMPUTED = "log-probs computed once before training, cached with the pairs (no reference model while training)"
NONE = "none (reference-free)"
REFERENCE_FREE = (Objective.simpo, Objective.orpo)


@dataclass(frozen=True)
class PreferencePlan:
    name: str  # dpo | ipo | simpo
    beta: float
    label_smoothing: float
    simpo_gamma: float
    reference: str  # one of the descriptions above
    reference_bytes: float  # per GPU, counted in the memory line
    desirable_weight: float = 1.0  # kto
    undesirable_weight: float = 1.0

    @property
    def frozen_copy(self) -> bool:
        return self.reference == FROZEN_COPY

    @property
    def precomputed(self) -> bool:
        return self.reference == PRECOMPUTED

    @property
    def step_work(self) -> float:
        """A step's compute per example, in sequences trained (forward + backward = 1; a forward
        alone 1/3: 2 of its 6 FLOPs per parameter and token): a pair trains its chosen and rejected
        rows (2) and a reference scores both (2/3) unless its log-probs were precomputed or the
        objective has none; KTO trains the example, scores its KL row without gradients (1/3), and
        the reference scores both (2/3)."""
        reference = self.reference not in (NONE, PRECOMPUTED)
        if self.name == "kto":
            return 1 + 1 / 3 + (2 / 3 if reference else 0)
        return 2 + (2 / 3 if reference else 0)

    def to_dict(self) -> dict:
        return asdict(self)


def problems(cfg) -> list[Problem]:
    f, d = cfg.finetune, cfg.data
    preference = f.objective != Objective.sft
    found = []
    if preference and d.format != DataFormat.preference:
        found.append(Problem("data.format", d.format.value, f"finetune.objective={f.objective.value} trains on preference pairs", "set data.format=preference (records {prompt, chosen, rejected}), or finetune.objective=sft"))
    if d.format == DataFormat.preference and not preference:
        found.append(Problem("finetune.objective", f.objective.value, "data.format=preference holds chosen/rejected pairs, which next-token SFT does not train on", "set finetune.objective=dpo (or ipo, simpo, orpo)"))
    if not preference:
        return found
    # `not x > 0` alone lets inf through: an infinite beta makes the loss itself non-finite.
    if not (math.isfinite(f.beta) and f.beta > 0):
        found.append(Problem("finetune.beta", f.beta, "must be positive and finite (it scales the reward margin; ipo's margin target is 1/(2 beta))", "use e.g. finetune.beta=0.1"))
    if not math.isfinite(f.simpo_gamma):
        found.append(Problem("finetune.simpo_gamma", f.simpo_gamma, "must be a finite number (simpo's target reward margin)", "use e.g. finetune.simpo_gamma=0.5"))
    if not 0 <= f.label_smoothing < 0.5:
        found.append(Problem("finetune.label_smoothing", f.label_smoothing, "must be in [0, 0.5) (the share of pairs assumed mislabelled)", "use 0 (plain DPO) or e.g. 0.1"))
    elif f.label_smoothing and f.objective == Objective.ipo:
        found.append(Problem("finetune.label_smoothing", f.label_smoothing, "ipo has no label smoothing (its squared loss has no flipped-label term)", "set finetune.label_smoothing=0, or finetune.objective=dpo"))
    if f.precompute_reference and f.objective in REFERENCE_FREE:
        found.append(Problem("finetune.precompute_reference", True, f"{f.objective.value} is reference-free: there are no reference log-probs to compute", "set finetune.precompute_reference=false"))
    if f.label_smoothing and f.objective == Objective.orpo:
        found.append(Problem("finetune.label_smoothing", f.label_smoothing, "orpo has no label smoothing (TRL's odds-ratio loss has no flipped-label term)", "set finetune.label_smoothing=0"))
    if f.objective == Objective.kto:
        found += kto_problems(cfg)
    if d.train_on == TrainOn.all:
        found.append(Problem("data.train_on", "all", "a preference pair is scored on its answers only (prompt tokens are the same on both sides)", "remove data.train_on (assistant, the default)"))
    if d.pack:
        found.append(Problem("data.pack", True, "preference pairs are scored row by row (chosen and rejected in one micro batch), not packed", "set data.pack=false"))
    if d.sources:
        found.append(Problem("data.sources", f"{len(d.sources)} sources", "a mixture of preference data is not supported", "use one data.path (concatenate the files into one folder)"))
    return found


def smallest_micro_batch(cfg) -> int:
    """KTO forms each example's KL row from another example of its micro batch: two at least."""
    return 2 if cfg.finetune.objective == Objective.kto else 1


def kto_problems(cfg) -> list[Problem]:
    f = cfg.finetune
    found = []
    micro = micro_batch.configured(cfg.trainer.micro_batch_size)  # auto chooses 2 or more (smallest_micro_batch)
    if micro is not None and micro < 2:
        found.append(Problem("trainer.micro_batch_size", cfg.trainer.micro_batch_size, "kto estimates its KL term from each prompt paired with another example's completion in the same micro batch: one example has no other", "use trainer.micro_batch_size=2 or more (TRL requires a per-device batch > 1 too)"))
    if f.precompute_reference:
        found.append(Problem("finetune.precompute_reference", True, "kto's reference log-probs include its KL rows, which are formed per micro batch: they are not precomputed here", "set finetune.precompute_reference=false (LoRA: the base with adapters off; full: a frozen copy)"))
    if f.label_smoothing:
        found.append(Problem("finetune.label_smoothing", f.label_smoothing, "kto has no label smoothing", "set finetune.label_smoothing=0"))
    for key, value in (("finetune.desirable_weight", f.desirable_weight), ("finetune.undesirable_weight", f.undesirable_weight)):
        if not (math.isfinite(value) and value > 0):
            found.append(Problem(key, value, "must be positive and finite (it weighs that side's examples in the loss)", f"use e.g. {key}=1.0 (TRL's default)"))
    return found


def reference_bytes(strategy, params: int, *, world: int, tp: int, zero_stage: int, offload_params: bool, fp32: bool = False) -> float:
    """A frozen copy held like the policy: its weights only (no gradients, no optimizer state), by
    the strategy table's formula (plan/parallel.py)."""
    layout = StateLayout(world=world, tp=tp, zero_stage=zero_stage, offload_params=offload_params, fp32=fp32)
    return strategy_row(strategy).frozen_copy_bytes(params, layout)


def make(cfg, params: int, world: int, fp32: bool = False) -> PreferencePlan | None:
    """`fp32`: the run trains in fp32 (a DeepSpeed reference copy is held in the training dtype)."""
    f, par = cfg.finetune, cfg.parallel
    if f.objective == Objective.sft:
        return None
    held = 0.0
    if f.objective in REFERENCE_FREE:
        reference = NONE
    elif f.precompute_reference:
        reference = PRECOMPUTED
    elif f.method != FinetuneMethod.full:
        reference = ADAPTERS_OFF
    else:
        reference = FROZEN_COPY
        held = reference_bytes(par.strategy, params, world=world, tp=par.tp, zero_stage=par.zero_stage, offload_params=par.offload_params, fp32=fp32)
    return PreferencePlan(f.objective.value, float(f.beta), float(f.label_smoothing), float(f.simpo_gamma), reference, held, float(f.desirable_weight), float(f.undesirable_weight))


def trainable_rows_problem(plan: PreferencePlan | None, adapters) -> None:
    """LoRA's trainable token rows move the vocab tables themselves; disabling the adapters does
    not undo that, so an online reference would drift with them."""
    if plan is None or plan.reference != ADAPTERS_OFF or not adapters.trainable_token_ids:
        return
    raise ConfigError(
        Problem(
            "finetune.trainable_tokens",
            "auto",
            f"the rows of {len(adapters.trainable_token_ids)} token(s) train beside the adapters ({adapters.trainable_tokens_reason.split(':')[0]}); disabling the adapters does not undo them, so the {plan.name} reference would drift",
            # kto refuses a precomputed reference (kto_problems): its KL rows are formed per micro batch
            "set finetune.trainable_tokens=none" if plan.name == Objective.kto.value else "set finetune.precompute_reference=true (the reference's log-probs computed before training), or finetune.trainable_tokens=none",
        )
    )


def memory_problem(plan: PreferencePlan | None, memory) -> None:
    """Full fine-tuning that fits without the frozen reference copy but not with it."""
    if plan is None or not plan.frozen_copy or memory.fits is not False:
        return
    without = memory.total_gib - plan.reference_bytes / GIB
    if without > memory.gpu_memory_gib:
        return  # it does not fit either way: the memory line says so
    raise ConfigError(
        Problem(
            "finetune.precompute_reference",
            False,
            f"{plan.name} on full fine-tuning holds a frozen reference copy ({plan.reference_bytes / GIB:.1f} GiB per GPU); with it the run needs {memory.total_gib:.1f} GiB of the GPU's {memory.gpu_memory_gib:.1f} GiB, without it {without:.1f} GiB",
            # kto refuses a precomputed reference (kto_problems): its KL rows are formed per micro batch
            ("use " if plan.name == Objective.kto.value else "set finetune.precompute_reference=true (its log-probs computed once before training, no copy held), or ")
            + "finetune=lora (the reference is the base with adapters off), or a higher ZeRO stage / parallel=fsdp_tp",
        )
    )


def logits_loss(fast):
    """Preference objectives score whole sequences from the logits: the chunked and fused
    cross-entropy paths (which return one mean loss) are not used."""
    if not (fast.loss_chunk_tokens or fast.liger_loss):
        return fast
    reasons = {**fast.reasons, "loss_chunk_tokens": "off: preference objectives score each sequence from its logits"}
    return replace(fast, loss_chunk_tokens=0, liger_loss=False, reasons=reasons)

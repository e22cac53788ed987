"""The hardware a run is planned for, its precision and its padded vocab, from the config.

Each is decided once, by the planner (tinytrain/plan/planner.py), from the pure functions in
hardware.py, precision.py and vocab.py; the rest of tinytrain reads them from the RunPlan.
"""

from __future__ import annotations

import logging

from tinytrain.config.schema import PLANNING_MODES
from tinytrain.errors import ConfigError, Problem
from tinytrain.plan import hardware as hw_table
from tinytrain.plan.parallel import strategy_row
from tinytrain.plan.precision import (
    LossScalePolicy,
    PrecisionDecision,
    resolve_precision,
)
from tinytrain.plan.vocab import VocabPlan, plan_vocab

log = logging.getLogger(__name__)


def effective_hardware(cfg) -> hw_table.Hardware:
    """`hardware.gpu` in mode=plan or sbatch; otherwise the accelerator this process will train on."""
    name = cfg.hardware.gpu
    planned = hw_table.lookup_gpu(name) if name else None  # an unknown name was refused by validate
    if cfg.mode in PLANNING_MODES and planned is not None:
        return planned
    detected = hw_table.detect()
    if planned is not None and planned.name != detected.name:
        log.warning("hardware.gpu=%s was given, but this process runs on %s: resolving for %s", name, hw_table.describe(detected), hw_table.describe(detected))
    return detected


def loss_scale_policy(cfg) -> LossScalePolicy:
    ls = cfg.precision.loss_scale
    return LossScalePolicy(ls.initial_scale_power, ls.window, ls.hysteresis, float(ls.min_scale))


def precision_decision(cfg, hardware: hw_table.Hardware) -> PrecisionDecision:
    return resolve_precision(hardware, cfg.precision.request.value, loss_scale_policy(cfg), deepspeed=strategy_row(cfg.parallel.strategy).deepspeed)


def vocab_plan(cfg, true_vocab: int) -> VocabPlan:
    """The padded vocab; an explicit model.vocab_size must hold the tokenizer and suit tp."""
    derived = plan_vocab(true_vocab, cfg.model.vocab_multiple, cfg.parallel.tp)
    if cfg.model.vocab_size is None:
        return derived
    explicit = cfg.model.vocab_size
    if explicit < true_vocab and cfg.preflight.vocab.value != "error":
        log.warning("preflight vocab: model.vocab_size=%d < len(tokenizer)=%d; using the derived %s (preflight.vocab=%s)", explicit, true_vocab, derived.describe(), cfg.preflight.vocab.value)
        return derived
    if explicit < true_vocab:
        raise ConfigError(
            Problem(
                "model.vocab_size",
                explicit,
                f"smaller than the tokenizer: len(tokenizer) is {true_vocab} (added tokens included), so token ids "
                f"up to {true_vocab - 1} would index past the embedding",
                f"remove the override to derive it ({derived.describe()}) or set model.vocab_size>={true_vocab} "
                "(preflight.vocab=warn uses the derived size instead)",
            )
        )
    if explicit % cfg.parallel.tp:
        raise ConfigError(
            Problem("model.vocab_size", explicit, f"not divisible by parallel.tp={cfg.parallel.tp}", f"remove the override to derive {derived.padded}")
        )
    return VocabPlan(true_vocab, explicit, cfg.model.vocab_multiple, cfg.parallel.tp)

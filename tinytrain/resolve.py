"""Derived values of a run: hardware, precision, vocab, world size and batch arithmetic.

Every value comes from one pure function (vocab.py, precision.py) called here, by the OmegaConf
resolvers, by the plan and by the trainer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from omegaconf import OmegaConf

from tinytrain import hardware as hw_table
from tinytrain.config.schema import PLANNING_MODES
from tinytrain.errors import ConfigError, Problem
from tinytrain.precision import LossScalePolicy, PrecisionDecision, resolve_precision
from tinytrain.vocab import VocabPlan, plan_vocab

log = logging.getLogger(__name__)


def effective_hardware(cfg) -> hw_table.Hardware:
    """`hardware.gpu` in mode=plan or sbatch; otherwise the accelerator this process will train on."""
    name = cfg.hardware.gpu
    planned = hw_table.lookup_gpu(name) if name else None
    if name and planned is None:
        raise ConfigError(unknown_gpu_problem(name))
    if cfg.mode in PLANNING_MODES and planned is not None:
        return planned
    detected = hw_table.detect()
    if planned is not None and planned.name != detected.name:
        log.warning("hardware.gpu=%s was given, but this process runs on %s: resolving for %s", name, hw_table.describe(detected), hw_table.describe(detected))
    return detected


def unknown_gpu_problem(name: str) -> Problem:
    return Problem("hardware.gpu", name, "unknown GPU", f"use one of {', '.join(hw_table.known_gpu_names())}")


def loss_scale_policy(cfg) -> LossScalePolicy:
    ls = cfg.precision.loss_scale
    return LossScalePolicy(ls.initial_scale_power, ls.window, ls.hysteresis, float(ls.min_scale))


def precision_decision(cfg) -> PrecisionDecision:
    return resolve_precision(effective_hardware(cfg), cfg.precision.request.value, loss_scale_policy(cfg))


def vocab_plan(cfg, true_vocab: int) -> VocabPlan:
    """The padded vocab; an explicit model.vocab_size must hold the tokenizer and suit tp."""
    derived = plan_vocab(true_vocab, cfg.model.vocab_multiple, cfg.parallel.tp)
    if OmegaConf.is_interpolation(cfg.model, "vocab_size"):
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


@dataclass(frozen=True)
class BatchPlan:
    micro_batch_size: int
    accumulate_grad_batches: int
    data_parallel: int
    global_batch_size: int
    seq_len: int

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.seq_len


def devices_per_node(cfg) -> int:
    if cfg.cluster.devices is not None:
        return cfg.cluster.devices
    if cfg.mode in PLANNING_MODES and cfg.hardware.gpu:
        return 1
    import torch

    return max(torch.cuda.device_count(), 1)


def world_size(cfg) -> int:
    return cfg.cluster.nodes * devices_per_node(cfg)


def batch_problems(cfg, world: int) -> tuple[BatchPlan | None, list[Problem]]:
    t = cfg.trainer
    tp = cfg.parallel.tp
    problems = []
    if tp < 1 or world % tp:
        problems.append(
            Problem("parallel.tp", tp, f"must divide the world size {world} (nodes {cfg.cluster.nodes} x devices {devices_per_node(cfg)})", "choose a tp that divides the number of processes")
        )
        return None, problems
    dp = world // tp
    micro = t.micro_batch_size
    if t.global_batch_size is None:
        accum = t.accumulate_grad_batches or 1
        return BatchPlan(micro, accum, dp, micro * dp * accum, cfg.data.seq_len), problems
    per_step = micro * dp
    if t.global_batch_size % per_step:
        problems.append(
            Problem(
                "trainer.global_batch_size",
                t.global_batch_size,
                f"not a multiple of micro_batch_size({micro}) x data_parallel({dp}) = {per_step}",
                f"use a multiple of {per_step}, or change trainer.micro_batch_size",
            )
        )
        return None, problems
    accum = t.global_batch_size // per_step
    if t.accumulate_grad_batches is not None and t.accumulate_grad_batches != accum:
        problems.append(
            Problem(
                "trainer.accumulate_grad_batches",
                t.accumulate_grad_batches,
                f"disagrees with global_batch_size({t.global_batch_size}) / (micro_batch_size({micro}) x data_parallel({dp})) = {accum}",
                "set only one of trainer.global_batch_size and trainer.accumulate_grad_batches",
            )
        )
        return None, problems
    return BatchPlan(micro, accum, dp, t.global_batch_size, cfg.data.seq_len), problems


@dataclass(frozen=True)
class Resolved:
    hardware: hw_table.Hardware
    precision: PrecisionDecision
    vocab: VocabPlan
    batch: BatchPlan
    world_size: int
    tokenizer_fingerprint: str


def resolve(cfg, tokenizer) -> Resolved:
    from tinytrain.tokenizer import fingerprint

    world = world_size(cfg)
    batch, problems = batch_problems(cfg, world)
    if problems:
        raise ConfigError(problems)
    return Resolved(
        hardware=effective_hardware(cfg),
        precision=precision_decision(cfg),
        vocab=vocab_plan(cfg, len(tokenizer)),
        batch=batch,
        world_size=world,
        tokenizer_fingerprint=fingerprint(tokenizer),
    )

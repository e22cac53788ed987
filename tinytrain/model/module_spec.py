"""What the LightningModule needs of a run, taken from its plan once: the vocab and checkpoint
metadata, what the strategy does for it (tensor parallelism, clipping, DeepSpeed's config and CPU
Adam), the fast paths, the schedule, the preference objective, and the optimizer's settings.
Tests and benchmarks build one with the pieces they need; the rest keep their defaults."""

from __future__ import annotations

from dataclasses import dataclass, field

from tinytrain.config.schema import OptimizerName
from tinytrain.model.preference_loss import PreferenceObjective
from tinytrain.plan.schedule import Schedule


@dataclass(frozen=True)
class OptimizerSettings:
    """The optimizer's settings from trainer.* (model/optimizers.py reads these names; their
    defaults are the schema's)."""

    optimizer: OptimizerName
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float
    muon_momentum: float
    grad_clip: float
    muon_ns_dtype: str = "bfloat16"  # the plan's (plan/optimizer.py): torch dtype name of Newton-Schulz

    @classmethod
    def from_trainer(cls, t, muon_ns_dtype: str = "bfloat16") -> OptimizerSettings:
        return cls(OptimizerName(t.optimizer), float(t.lr), tuple(t.betas), float(t.eps), float(t.weight_decay), float(t.muon_momentum), float(t.grad_clip), muon_ns_dtype)


@dataclass(frozen=True)
class ModuleSpec:
    true_vocab: int
    checkpoint_metadata: dict = field(default_factory=dict)
    tensor_parallel: bool = False  # fsdp_tp: the module shards itself in configure_model
    clip_in_module: bool = True  # False under DeepSpeed, whose engine clips
    cpu_adam: bool = False  # DeepSpeed's CPU Adam, for optimizer offload
    fused_adamw: bool = False
    loss_chunk_tokens: int = 0
    liger_loss: bool = False
    adapters: bool = False  # finetune=lora|qlora: a frozen base
    schedule: Schedule | None = None
    objective: PreferenceObjective | None = None  # finetune.objective=dpo|ipo|simpo|orpo|kto
    deepspeed_config: dict | None = None
    optimizer: OptimizerSettings | None = None  # None: a module that is not trained (tests, benchmarks)

    @classmethod
    def for_plan(cls, plan, trainer_cfg) -> ModuleSpec:
        row, fast, pref = plan.parallel.row, plan.fast_paths, plan.preference
        return cls(
            true_vocab=plan.vocab.true,
            checkpoint_metadata=plan.checkpoint_metadata(),
            tensor_parallel=row.tensor_parallel,
            clip_in_module=not row.deepspeed,
            cpu_adam=row.deepspeed and plan.parallel.offload_optimizer,
            fused_adamw=fast.fused_adamw,
            loss_chunk_tokens=fast.loss_chunk_tokens,
            liger_loss=fast.liger_loss,
            adapters=plan.finetune is not None,
            schedule=plan.schedule,
            objective=pref and PreferenceObjective(pref.name, pref.beta, pref.label_smoothing, pref.simpo_gamma, pref.desirable_weight, pref.undesirable_weight),
            deepspeed_config=plan.deepspeed,
            optimizer=OptimizerSettings.from_trainer(trainer_cfg, plan.optimizer.ns_dtype if plan.optimizer else "bfloat16"),
        )

"""trainer.optimizer in the plan: which parameters Muon takes, what its state costs, what is refused.

Optimizer state per trainable parameter (fp32): AdamW keeps two moments (8 B); Muon one momentum
buffer (4 B) for the hidden matrices, AdamW's 8 B for the rest. Under ZeRO the Muon momentum is
partitioned with the rest of the optimizer state (each rank holds 1/dp of it, and saves that
much); the orthogonalisation gathers one whole matrix's gradient and momentum at a time
(DeepSpeed caps that buffer at 64 MiB, batching matrices under it), so the transient cost is
one matrix, not the model. Single and ddp hold the whole state on every rank, as AdamW's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tinytrain.config.schema import FinetuneMethod, OptimizerName
from tinytrain.errors import Problem
from tinytrain.plan.memory import ModelStateMemory, StateLayout
from tinytrain.plan.model_shape import ModelShape, parameter_count
from tinytrain.plan.parallel import strategy_row


@dataclass(frozen=True)
class OptimizerPlan:
    name: str
    muon_params: int  # hidden matrices Muon steps (0 under adamw)
    adamw_params: int

    @property
    def state_bytes(self) -> int:
        """fp32 optimizer state of the whole model (before any partitioning)."""
        return 4 * self.muon_params + 8 * self.adamw_params

    @property
    def saved_fraction(self) -> float:
        """This state as a share of AdamW's for the same parameters."""
        return self.state_bytes / (8 * (self.muon_params + self.adamw_params))

    def to_dict(self) -> dict:
        return {"name": self.name, "muon_params": self.muon_params, "adamw_params": self.adamw_params, "state_bytes": self.state_bytes}


def hidden_matrix_params(s: ModelShape) -> int:
    """q, k, v, o and gate, up, down of every layer (parameter_count's matrices)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return s.layers * (2 * s.hidden * q + 2 * s.hidden * kv + 3 * s.hidden * s.intermediate)


def make(t, shape: ModelShape, trainable: int) -> OptimizerPlan:
    if t.optimizer != OptimizerName.muon:
        return OptimizerPlan(t.optimizer.value, 0, trainable)
    muon = hidden_matrix_params(shape)
    return OptimizerPlan(t.optimizer.value, muon, parameter_count(shape) - muon)


def states(memory: ModelStateMemory, plan: OptimizerPlan, layout: StateLayout, *, deepspeed: bool) -> ModelStateMemory:
    """The strategy's model-state memory with Muon's 4 B (not 8 B) of state per hidden weight:
    partitioned over the world under ZeRO, whole on every rank otherwise."""
    if not plan.muon_params or layout.offload_optimizer:
        return memory
    return replace(memory, optimizer=memory.optimizer - 4.0 * plan.muon_params / (layout.world if deepspeed else 1))


def line(plan: dict, strategy: str, deepspeed: bool) -> str:
    """The printed plan's optimizer line (from plan.json's `optimizer`)."""
    state = f"{plan['state_bytes'] / 2**20:.1f} MiB fp32 state"
    if plan["name"] != OptimizerName.muon.value:
        return f"optimizer  adamw: two fp32 moments per trainable parameter, {state}"
    engine = "DeepSpeed's MuonWithAuxAdam: ZeRO gathers each matrix's gradient and momentum to orthogonalise it, the momentum stays partitioned" if deepspeed else f"torch.optim.Muon + torch.optim.AdamW ({strategy}: whole gradients on every rank)"
    total = plan["muon_params"] + plan["adamw_params"]
    return (
        f"optimizer  muon: {plan['muon_params']:,} hidden-matrix parameters on Muon (Nesterov, Newton-Schulz, rate 0.2 sqrt(max(rows, cols)) x lr), "
        f"{plan['adamw_params']:,} on AdamW (embeddings, head, norms); {state} = {plan['state_bytes'] / (8 * total):.2f} x AdamW's; {engine}"
    )


def problems(cfg) -> list[Problem]:
    t = cfg.trainer
    found = []
    if not 0.0 <= t.muon_momentum < 1.0:
        found.append(Problem("trainer.muon_momentum", t.muon_momentum, "must be in [0, 1) (Muon's Nesterov momentum)", "use e.g. trainer.muon_momentum=0.95"))
    if t.optimizer != OptimizerName.muon:
        return found
    if cfg.finetune.method != FinetuneMethod.full:
        found.append(Problem("trainer.optimizer", t.optimizer.value, f"Muon steps the model's 2-D hidden weight matrices, and finetune={cfg.finetune.method.value} trains none of them (only low-rank adapters on a frozen base)", "use trainer.optimizer=adamw with LoRA, or finetune=full to train the hidden weights with Muon"))
    row = strategy_row(cfg.parallel.strategy)
    if row.tensor_parallel:
        found.append(Problem("trainer.optimizer", t.optimizer.value, f"Muon is not built for parallel={cfg.parallel.strategy.value} yet: its matrices are DTensor shards, and Newton-Schulz needs each whole matrix", "use parallel=zero2 (DeepSpeed gathers each matrix for Muon) or ddp, or trainer.optimizer=adamw"))
    if row.deepspeed and cfg.parallel.offload_optimizer:
        found.append(Problem("parallel.offload_optimizer", True, "Muon with optimizer offload is not checked here (DeepSpeed's CPU Adam is AdamW only)", "use parallel=zero2 or zero3 without offload, or trainer.optimizer=adamw"))
    return found

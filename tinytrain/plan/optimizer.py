"""trainer.optimizer in the plan: which parameters Muon takes, what its state costs, what is refused.

Optimizer state per trainable parameter (fp32): AdamW keeps two moments (8 B); Muon one momentum
buffer (4 B) for the hidden matrices, AdamW's 8 B for the rest. Under ZeRO the Muon momentum is
partitioned with the rest of the optimizer state (each rank holds 1/dp of it, and saves that
much); the orthogonalisation gathers one whole matrix's gradient and momentum at a time
(DeepSpeed caps that buffer at 64 MiB, batching matrices under it), so the transient cost is
one matrix, not the model; under zero2_offload the partitions (momentum and AdamW's moments)
are on the CPU, orthogonalised by DeepSpeed and stepped by MuonWithAuxAdam there. Under fsdp_tp
the momentum is a shard like the weights (1/(dp x tp) per rank); each step all-gathers one
matrix's update at a time for Newton-Schulz (model/gathered_muon.py), so the transient is the
largest matrix in fp32. Single and ddp hold the whole state on every rank, as AdamW's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from tinytrain.config.schema import FinetuneMethod, OptimizerName
from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.memory import ModelStateMemory, StateLayout
from tinytrain.plan.model_shape import ModelShape, parameter_count
from tinytrain.plan.parallel import strategy_row


@dataclass(frozen=True)
class OptimizerPlan:
    name: str
    muon_params: int  # hidden matrices Muon steps (0 under adamw)
    adamw_params: int
    largest_matrix: tuple[int, int] = (0, 0)  # (rows, cols) of the largest Muon matrix: what one gather holds
    ns_dtype: str = "bfloat16"  # Newton-Schulz's torch dtype outside DeepSpeed: bf16 (torch's), fp32 under 32-true

    @property
    def state_bytes(self) -> int:
        """fp32 optimizer state of the whole model (before any partitioning)."""
        return 4 * self.muon_params + 8 * self.adamw_params

    @property
    def saved_fraction(self) -> float:
        """This state as a share of AdamW's for the same parameters."""
        return self.state_bytes / (8 * (self.muon_params + self.adamw_params))

    def to_dict(self) -> dict:
        return {"name": self.name, "muon_params": self.muon_params, "adamw_params": self.adamw_params, "state_bytes": self.state_bytes, "largest_matrix": list(self.largest_matrix), "ns_dtype": self.ns_dtype}


def hidden_matrix_params(s: ModelShape) -> int:
    """q, k, v, o and gate, up, down of every layer (parameter_count's matrices)."""
    q, kv = s.heads * s.head_dim, s.kv_heads * s.head_dim
    return s.layers * (2 * s.hidden * q + 2 * s.hidden * kv + 3 * s.hidden * s.intermediate)


def make(t, shape: ModelShape, trainable: int, *, fp32: bool = False) -> OptimizerPlan:
    """`fp32`: training runs in 32-true, and so does Newton-Schulz (model/gathered_muon.py says why)."""
    if t.optimizer != OptimizerName.muon:
        return OptimizerPlan(t.optimizer.value, 0, trainable)
    muon = hidden_matrix_params(shape)
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    largest = max([(q, shape.hidden), (kv, shape.hidden), (shape.hidden, q), (shape.intermediate, shape.hidden), (shape.hidden, shape.intermediate)], key=lambda rc: rc[0] * rc[1])
    return OptimizerPlan(t.optimizer.value, muon, parameter_count(shape) - muon, largest, "float32" if fp32 else "bfloat16")


def states(memory: ModelStateMemory, plan: OptimizerPlan, layout: StateLayout, *, partitioned: bool) -> ModelStateMemory:
    """The strategy's model-state memory with Muon's 4 B (not 8 B) of state per hidden weight:
    partitioned over the world under ZeRO and fsdp_tp (dp x tp shards), whole on every rank otherwise."""
    if not plan.muon_params or layout.offload_optimizer:
        return memory
    return replace(memory, optimizer=memory.optimizer - 4.0 * plan.muon_params / (layout.world if partitioned else 1))


def engine(plan: dict, parallel: dict, deepspeed: dict | None) -> str:
    """How Muon runs under the strategy, and what its state costs per rank."""
    if deepspeed:
        held = "the momentum stays partitioned"
        if "offload_optimizer" in deepspeed["zero_optimization"]:
            held = "the momentum and AdamW's moments stay partitioned on the CPU, stepped by MuonWithAuxAdam's torch code (DeepSpeedCPUAdam is AdamW only)"
        return f"DeepSpeed's MuonWithAuxAdam: ZeRO gathers each matrix's gradient and momentum to orthogonalise it, {held}"
    ns = "bf16" if plan["ns_dtype"] == "bfloat16" else "fp32 (training runs in fp32; torch's Muon has bf16 only)"
    if not strategy_row(parallel["strategy"]).tensor_parallel:
        muon = "torch.optim.Muon" if plan["ns_dtype"] == "bfloat16" else "torch.optim.Muon's update"
        return f"{muon} + torch.optim.AdamW ({parallel['strategy']}: whole gradients on every rank), Newton-Schulz in {ns}"
    shards = parallel["dp"] * parallel["tp"]
    rows, cols = plan["largest_matrix"]
    return (
        f"torch.optim.Muon's update on DTensor shards + torch.optim.AdamW: the momentum is sharded like the weights over dp {parallel['dp']} x tp {parallel['tp']} "
        f"({4 * plan['muon_params'] / shards / 2**20:.1f} MiB per rank); each step all-gathers one matrix's update at a time (the largest {rows} x {cols}: "
        f"{4 * rows * cols / 2**20:.1f} MiB fp32), runs Newton-Schulz on it in {ns} and applies this rank's shard of the result"
    )


def line(plan: dict, parallel: dict, deepspeed: dict | None) -> str:
    """The printed plan's optimizer line (from plan.json's `optimizer`, `parallel` and `deepspeed`)."""
    state = f"{plan['state_bytes'] / 2**20:.1f} MiB fp32 state"
    if plan["name"] != OptimizerName.muon.value:
        return f"optimizer  adamw: two fp32 moments per trainable parameter, {state}"
    total = plan["muon_params"] + plan["adamw_params"]
    return (
        f"optimizer  muon: {plan['muon_params']:,} hidden-matrix parameters on Muon (Nesterov, Newton-Schulz, rate 0.2 sqrt(max(rows, cols)) x lr), "
        f"{plan['adamw_params']:,} on AdamW (embeddings, head, norms); {state} = {plan['state_bytes'] / (8 * total):.2f} x AdamW's; {engine(plan, parallel, deepspeed)}"
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
    return found


def resume_problem(t, resume, dp: int) -> None:
    """A Muon run resuming a DeepSpeed checkpoint of another data-parallel size: the conversion to
    DeepSpeed's universal checkpoint (ds_to_universal, DeepSpeed 0.19) reads each optimizer group's
    exp_avg and exp_avg_sq, and a Muon group holds only its momentum_buffer."""
    if t.optimizer != OptimizerName.muon or resume is None or resume.universal is None:
        return
    raise ConfigError(
        Problem(
            "resume",
            str(resume.path),
            f"a trainer.optimizer=muon DeepSpeed checkpoint saved on another data-parallel size than this run's {dp} would be converted by DeepSpeed's universal checkpoint (ds_to_universal), which carries AdamW's exp_avg and exp_avg_sq and not Muon's momentum_buffer",
            "resume on the data-parallel size it was saved on, or start a new run from its weights: run.name=<new> checkpoint.init_from=<this checkpoint> (parallel=fsdp_tp and ddp/single resume Muon on any data-parallel size)",
        )
    )

"""The optimizer of trainer.optimizer: AdamW, or Muon for the hidden matrices with AdamW for the rest.

Muon (Keller Jordan's; "Muon is Scalable for LLM Training", Moonshot) orthogonalises each 2-D
hidden weight's Nesterov momentum by Newton-Schulz; embeddings, the lm_head, norms and biases stay
on AdamW, as both recipes split them. Its rate is adjusted per matrix to 0.2 x sqrt(max(rows, cols))
x lr (Moonshot's "match_rms_adamw"): the update's RMS then matches AdamW's, so trainer.lr and
weight_decay tuned for AdamW carry over, and the decay is lr x weight_decay as AdamW's.

Three engines, one update rule:
- single / ddp: PyTorch's own `torch.optim.Muon` (gradients are whole and identical on every rank).
- fsdp_tp: `GatheredMuon` (model/gathered_muon.py): torch's Muon with each sharded matrix's update
  gathered for Newton-Schulz and the rank's shard of the result applied; momentum stays sharded.
  It also runs single / ddp under 32-true, whose Newton-Schulz is fp32 (torch's is bf16 only).
- DeepSpeed ZeRO 1/2/3: DeepSpeed's `MuonWithAuxAdam`. ZeRO holds flat partitions, so the
  orthogonalisation needs each whole matrix: ZeRO gathers each Muon matrix's gradient and momentum
  (stage_1_and_2.py `get_flat_partition`, stage3.py per sub-group), orthogonalises it and writes the
  update into the partition. Its momentum is an EMA (lerp) where torch's is a sum; Newton-Schulz
  normalises its input first, so the two give the same direction. DeepSpeed always scales by
  sqrt(max(1, rows/cols)); each Muon group here holds one shape, and its lr and weight decay are
  set so the applied step is the same 0.2 x sqrt(max(rows, cols)) x lr with decay lr x weight_decay.
"""

from __future__ import annotations

import math

import torch

from tinytrain.config.schema import OptimizerName

MUON_RMS = 0.2  # Moonshot: 0.2 x sqrt(max(A, B)) matches AdamW's update RMS


def hidden_matrix(model: torch.nn.Module, p: torch.Tensor) -> bool:
    """A 2-D weight of a hidden layer: not the input embedding nor the lm_head (Muon's domain)."""
    tables = {id(model.get_input_embeddings().weight)}
    if model.get_output_embeddings() is not None:
        tables.add(id(model.get_output_embeddings().weight))
    return p.ndim == 2 and id(p) not in tables


def adamw_groups(model: torch.nn.Module, params: list[torch.Tensor], weight_decay: float, vocab_tables_decay: bool) -> list[dict]:
    """No weight decay on norms, biases and embeddings (1-D or embedding tables); nor on the lm_head
    when `vocab_tables_decay` is false (LoRA trains only some rows of it: decay would move the rest)."""
    embeddings = {id(model.get_input_embeddings().weight)}
    if not vocab_tables_decay and model.get_output_embeddings() is not None:
        embeddings.add(id(model.get_output_embeddings().weight))
    decay = [p for p in params if not (p.ndim < 2 or id(p) in embeddings)]
    no_decay = [p for p in params if p.ndim < 2 or id(p) in embeddings]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def muon_scale(shape) -> float:
    """Moonshot's per-matrix rate multiplier (torch's adjust_lr_fn="match_rms_adamw")."""
    return MUON_RMS * math.sqrt(max(shape[0], shape[1]))


def deepspeed_muon_scale(shape) -> float:
    """The multiplier that, times DeepSpeed's own sqrt(max(1, rows/cols)), gives muon_scale."""
    return muon_scale(shape) / math.sqrt(max(1.0, shape[0] / shape[1]))


def optimizer_groups(model: torch.nn.Module, t, *, vocab_tables_decay: bool = True, deepspeed: bool = False) -> list[dict]:
    """The param groups, in the optimizer's order (checkpoint state is named by it). Under muon the
    hidden matrices come first, flagged `use_muon` (and tagged on the tensor, as DeepSpeed's ZeRO
    reads it); under DeepSpeed one Muon group per shape, carrying its `lr_scale`."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    groups: list[dict] = []
    if t.optimizer == OptimizerName.muon:
        muon = [p for p in trainable if hidden_matrix(model, p)]
        rest = [p for p in trainable if not hidden_matrix(model, p)]
        if deepspeed:
            shapes = sorted({tuple(p.shape) for p in muon})
            for shape in shapes:
                scale = deepspeed_muon_scale(shape)
                # DeepSpeed decays by group lr x weight_decay: divide so the decay is lr x weight_decay.
                groups.append({"params": [p for p in muon if tuple(p.shape) == shape], "use_muon": True, "lr_scale": scale, "weight_decay": t.weight_decay / scale, "momentum": t.muon_momentum})
        else:
            groups.append({"params": muon, "use_muon": True, "lr_scale": 1.0, "weight_decay": t.weight_decay})
        groups += [{**g, "use_muon": False, "lr_scale": 1.0} for g in adamw_groups(model, rest, t.weight_decay, vocab_tables_decay)]
        for g in groups:
            for p in g["params"]:
                p.use_muon = g["use_muon"]
    else:
        groups = adamw_groups(model, trainable, t.weight_decay, vocab_tables_decay)
    # An empty group is left out: DeepSpeed drops it from the optimizer, and the schedule built on
    # the groups would then step one group too many (LoRA without trainable token rows has only
    # decayed adapter matrices).
    return [g for g in groups if g["params"]]


def muon_optimizer(groups: list[dict], ns_dtype: str, options: dict) -> torch.optim.Muon:
    """PyTorch's own torch.optim.Muon for whole tensors with bf16 Newton-Schulz (its only kind);
    GatheredMuon for DTensor shards (fsdp_tp) or fp32 Newton-Schulz (32-true, model/gathered_muon.py)."""
    from torch.distributed.tensor import DTensor

    if ns_dtype == "bfloat16" and not any(isinstance(p, DTensor) for g in groups for p in g["params"]):
        return torch.optim.Muon(groups, **options)
    from tinytrain.model.gathered_muon import GatheredMuon

    return GatheredMuon(groups, ns_dtype=getattr(torch, ns_dtype), **options)


class MuonWithAdamW(torch.optim.Optimizer):
    """One optimizer (Lightning and checkpoints see one) over groups flagged `use_muon`: those step
    with torch.optim.Muon, the rest with torch.optim.AdamW. The inner optimizers share this one's
    group dicts and state, so the schedule's rates, state_dict and load_state_dict are this one's."""

    def __init__(self, groups: list[dict], *, lr: float, betas, eps: float, momentum: float, ns_dtype: str = "bfloat16", fused: bool | None = None):
        super().__init__(groups, {"lr": lr})
        self.ns_dtype = ns_dtype
        self.muon_options = {"lr": lr, "momentum": momentum, "nesterov": True, "adjust_lr_fn": "match_rms_adamw"}
        self.adamw_options = {"lr": lr, "betas": betas, "eps": eps, "fused": fused}
        self.inner = self._link()

    def _link(self) -> list[torch.optim.Optimizer]:
        muon = [g for g in self.param_groups if g["use_muon"]]
        adam = [g for g in self.param_groups if not g["use_muon"]]
        inner = []
        if muon:
            inner.append(muon_optimizer(muon, self.ns_dtype, self.muon_options))
        if adam:
            inner.append(torch.optim.AdamW(adam, **self.adamw_options))
        for opt in inner:
            opt.param_groups = muon if isinstance(opt, torch.optim.Muon) else adam  # the same dicts
            opt.state = self.state
        return inner

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # new group dicts: link the inner optimizers to them
        self.inner = self._link()

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for opt in self.inner:
            opt.step()
        return loss


def build(groups: list[dict], t, *, cpu_adam: bool, fused_adamw: bool, deepspeed: bool) -> torch.optim.Optimizer:
    betas = tuple(t.betas)
    if t.optimizer == OptimizerName.muon:
        if deepspeed:
            from deepspeed.runtime.zero.muon.muon_optimizer import MuonWithAuxAdam

            for g in groups:  # the aux Adam's settings; Muon's group lr comes from the schedule
                # ns_method: DeepSpeed's default "gram" (Newton-Schulz on the Gram matrix, fp16 where
                # the accelerator has it, else fp32; torch's Muon runs the plain iteration in bf16).
                g.update(lr=t.lr * g["lr_scale"], betas=betas, eps=t.eps, momentum=t.muon_momentum, ns_method="gram")
            return MuonWithAuxAdam(groups)
        return MuonWithAdamW(groups, lr=t.lr, betas=betas, eps=t.eps, momentum=t.muon_momentum, ns_dtype=t.muon_ns_dtype, fused=fused_adamw or None)
    if cpu_adam:
        from deepspeed.ops.adam import DeepSpeedCPUAdam

        return DeepSpeedCPUAdam(groups, lr=t.lr, betas=betas, eps=t.eps, adamw_mode=True)
    adamw = torch.optim.AdamW(groups, lr=t.lr, betas=betas, eps=t.eps, fused=fused_adamw or None)
    # A fused AdamW unscales fp16's gradients inside its step, after the non-finite guard, the
    # logged grad_norm and the clipping have read them still times the loss scale (Lightning skips
    # its unscale for it). Declared plain, GradScaler unscales first; the update stays fused.
    adamw._step_supports_amp_scaling = False
    return adamw

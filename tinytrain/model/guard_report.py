"""What the runtime guards share: the loss scale and the first non-finite gradient in forward
order (the stop exception, TrainingStopped, is in errors.py)."""

from __future__ import annotations

import torch


def grad_scaler(trainer):
    """torch's GradScaler of an fp16 run outside DeepSpeed (Lightning's precision plugin's), else None."""
    return getattr(trainer.precision_plugin, "scaler", None)


def current_loss_scale(trainer) -> float | None:
    """The fp16 loss scale (GradScaler's or DeepSpeed's), None without fp16 loss scaling (DeepSpeed
    keeps a static scale of 1 under fp32/bf16: that is no loss scaling)."""
    scaler = grad_scaler(trainer)
    if scaler is not None:
        return float(scaler.get_scale())
    engine = deepspeed_engine(trainer)
    if engine is None or not engine.fp16_enabled():
        return None
    optimizer = getattr(engine, "optimizer", None)
    scale = getattr(optimizer, "cur_scale", None) or getattr(optimizer, "loss_scale", None)
    return float(scale) if scale is not None else None


def deepspeed_engine(trainer):
    """The DeepSpeed engine training this run, None under other strategies (and before setup)."""
    from lightning.pytorch.strategies import DeepSpeedStrategy

    if not isinstance(trainer.strategy, DeepSpeedStrategy):
        return None
    engine = trainer.strategy.deepspeed_engine
    return engine if hasattr(engine, "was_step_applied") else None


def accumulation_boundary(trainer) -> bool:
    """Whether the optimizer step a hook precedes updates the weights. Lightning calls the hooks only
    at accumulation boundaries, except under DeepSpeed, whose engine accumulates: there they come
    with every micro batch, and the engine knows which one ends the accumulation."""
    engine = deepspeed_engine(trainer) if trainer is not None else None
    return engine is None or engine.is_gradient_accumulation_boundary()


class ForwardOrder:
    """Parameter names in the order the forward pass first uses their modules (recorded once)."""

    def __init__(self):
        self.names: list[str] | None = None
        self._hooks = []
        self._seen: list[str] = []

    def attach(self, model: torch.nn.Module) -> None:
        for mod_name, module in model.named_modules():
            if any(True for _ in module.parameters(recurse=False)):
                self._hooks.append(module.register_forward_pre_hook(self._record(mod_name, module)))

    def _record(self, mod_name, module):
        def hook(*_):
            for p_name, _ in module.named_parameters(recurse=False):
                full = f"{mod_name}.{p_name}" if mod_name else p_name
                if full not in self._seen:
                    self._seen.append(full)

        return hook

    def freeze(self, model: torch.nn.Module) -> None:
        """After the first forward: stop recording; unused parameters go last."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        rest = [n for n, _ in model.named_parameters() if n not in self._seen]
        self.names = self._seen + rest


def first_nonfinite_gradient(model: torch.nn.Module, order: list[str] | None) -> str | None:
    params = dict(model.named_parameters())
    for name in order or list(params):
        p = params.get(name)
        if p is not None and p.grad is not None and not torch.isfinite(p.grad).all():
            return name
    return None

"""Float8 training of a built model's linear layers through torchao (plan/fp8.py decides)."""

from __future__ import annotations

MULTIPLE = 16  # float8 matmuls need both dimensions to be multiples of 16


def qualifies(module, name: str) -> bool:
    """A decoder block's projection: not the lm_head (the logits keep the run's precision)."""
    from torch import nn

    return isinstance(module, nn.Linear) and not name.endswith("lm_head") and module.in_features % MULTIPLE == 0 and module.out_features % MULTIPLE == 0


def apply_fp8(model, emulate: bool) -> int:
    """Swap the qualifying nn.Linear layers for torchao's Float8Linear in place (the weights and
    their names stay, so checkpoints and exports do not change); returns how many were swapped."""
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    from torchao.float8.float8_linear import Float8Linear

    convert_to_float8_training(model, config=Float8LinearConfig(emulate=emulate), module_filter_fn=qualifies)
    return sum(isinstance(m, Float8Linear) for m in model.modules())

"""precision.fp8=false|true|auto: float8 training of the linear layers through torchao.

torchao's float8 training (`torchao.float8.convert_to_float8_training`) swaps each qualifying
nn.Linear for a Float8Linear: its matmuls run in float8 (e4m3 forward, e5m2 gradients) with
dynamic per-tensor scales, while the weights, the optimizer and the checkpoints stay in the run's
precision, under the same names. Qualifying: the decoder blocks' projections, whose dimensions are
multiples of 16 (float8 matmuls need them); never the lm_head (the logits want the precision) nor
the embedding (a lookup, no matmul).

Float8 matmuls need compute capability >= 8.9 (Ada L40S/L4, Hopper H100/H200 and newer): `true`
on an older GPU or a CPU stops in the plan naming it. `auto` turns float8 on where the GPU has it and
the model is wide enough to gain (hidden >= AUTO_MIN_HIDDEN: below it the casts cost more than the
faster matmuls save, as torchao's own benchmarks show). `precision.fp8_emulate` runs torchao's
emulation (float8 rounding in ordinary matmuls) on any device: for tests, as
parallel.deepspeed_on_cpu is.
"""

from __future__ import annotations

import importlib.util
from dataclasses import asdict, dataclass

from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.hardware import describe

MIN_CAPABILITY = (8, 9)
AUTO_MIN_HIDDEN = 4096


@dataclass(frozen=True)
class Fp8Plan:
    enabled: bool
    emulate: bool
    reason: str

    def to_dict(self) -> dict:
        return asdict(self)


def read(value) -> bool | str | None:
    """True, False or "auto" from a boolean or a word; None for anything else."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        return {"true": True, "false": False, "auto": "auto"}.get(word)
    return None


def problems(cfg) -> list[Problem]:
    if read(cfg.precision.fp8) is None:
        return [Problem("precision.fp8", cfg.precision.fp8, "must be false, true or auto", "use precision.fp8=auto (float8 where the GPU has it and the model gains)")]
    return []


def installed() -> bool:
    return importlib.util.find_spec("torchao") is not None


def decide(cfg, hardware, *, hidden: int, strategy_blocker: str | None, finetune: bool, planning: bool, available: bool | None = None, fp32: bool = False) -> Fp8Plan:
    """`strategy_blocker`: the strategy table's fp8_off; `planning`: mode=plan/sbatch (the machine
    that trains needs torchao, not this one); `available`: torchao installed (asked when None);
    `fp32`: the run trains in fp32, which auto leaves that way (true still converts)."""
    want = read(cfg.precision.fp8)
    emulate = bool(cfg.precision.fp8_emulate)
    if want is False:
        if emulate:
            raise ConfigError(Problem("precision.fp8_emulate", True, "emulates float8 matmuls, which precision.fp8=false turns off: it would do nothing", "use precision.fp8=true with it (or auto), or drop precision.fp8_emulate"))
        return Fp8Plan(False, False, "off (precision.fp8=false)")
    if want is not True and fp32:
        request = getattr(cfg.precision.request, "value", cfg.precision.request)
        asked = f"precision={request}" + (" chose it here" if request == "auto" else "")
        return Fp8Plan(False, False, f"auto: off, the run trains in fp32 ({asked}): float8 would undo the precision it asks for")
    capable = not hardware.is_cpu and hardware.compute_capability >= MIN_CAPABILITY
    blocker = None
    if not capable and not emulate:
        where = "this run has no GPU" if hardware.is_cpu else f"{describe(hardware)} has less"
        blocker = f"float8 matmuls need compute capability >= {MIN_CAPABILITY[0]}.{MIN_CAPABILITY[1]} (L40S, H100, H200, ...) and {where}"
    elif strategy_blocker:
        blocker = strategy_blocker
    elif finetune:
        blocker = "LoRA's frozen base layers are not converted to float8"
    if want is True:
        if blocker:
            raise ConfigError(Problem("precision.fp8", True, blocker, "use precision.fp8=false (or auto, which turns it on only where it runs)"))
        here = installed() if available is None else available
        if not here and not planning:
            raise ConfigError(Problem("precision.fp8", True, "needs torchao (not installed)", "pip install 'tinytrain-llm[fp8]'"))
        how = "torchao's emulation (precision.fp8_emulate, for tests)" if emulate else f"torchao float8 on {describe(hardware)}"
        missing = "" if here else "; torchao is not installed on this machine: the one that trains needs it (pip install 'tinytrain-llm[fp8]')"
        return Fp8Plan(True, emulate, f"as configured: {how}{missing}")
    if blocker:
        return Fp8Plan(False, False, f"auto: off, {blocker}")
    if hidden < AUTO_MIN_HIDDEN:
        return Fp8Plan(False, False, f"auto: off, hidden {hidden} < {AUTO_MIN_HIDDEN} (the casts would cost more than the float8 matmuls save)")
    if not (installed() if available is None else available):
        return Fp8Plan(False, False, "auto: off, torchao is not installed (pip install 'tinytrain-llm[fp8]')")
    return Fp8Plan(True, emulate, f"auto: {describe(hardware)} has float8 matmuls and hidden {hidden} >= {AUTO_MIN_HIDDEN}")

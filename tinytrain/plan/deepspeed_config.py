"""The DeepSpeed config, generated from the composed config (no hand-kept JSON to drift).

Batch sizes come from the batch plan, the precision block from the precision decision (the fp16
block is the loss-scale policy's own mapping), ZeRO stage and offload from `parallel`.
`parallel.deepspeed_overrides` merges on top; the result is checked by DeepSpeed's own config
class, plus the checks DeepSpeed does not make (unknown top-level keys, gradient_clipping type).
"""

from __future__ import annotations

import copy
import difflib

from tinytrain.errors import ConfigError, Problem
from tinytrain.plan.layout import BatchPlan
from tinytrain.plan.precision import Dtype, PrecisionDecision

OVERRIDES_KEY = "parallel.deepspeed_overrides"
ZERO_OPTIONS = "parallel=zero1|zero2|zero3|zero2_offload|zero3_offload"


def override_problems(par, runs_deepspeed: bool) -> list[Problem]:
    """`parallel.deepspeed_overrides` may tune DeepSpeed, not contradict `parallel=`: the stage and
    the offloads decide the optimizer (DeepSpeedCPUAdam) and the memory plan too."""
    overrides = par.deepspeed_overrides
    if not overrides:
        return []
    if not runs_deepspeed:
        return [Problem(OVERRIDES_KEY, dict(overrides), f"parallel={par.name} does not run DeepSpeed, so these would be ignored", f"remove them, or pick {ZERO_OPTIONS}")]
    zero = overrides.get("zero_optimization") or {}
    problems = []
    if "stage" in zero and zero["stage"] != par.zero_stage:
        problems.append(Problem(f"{OVERRIDES_KEY}.zero_optimization.stage", zero["stage"], f"contradicts parallel={par.name} (ZeRO stage {par.zero_stage})", f"pick the stage with parallel=zero{zero['stage']} and remove the override"))
    for key, flag, option in (("offload_optimizer", "offload_optimizer", "zero2_offload or zero3_offload"), ("offload_param", "offload_params", "zero3_offload")):
        if key in zero and getattr(par, flag) != _offloads(zero[key]):
            problems.append(Problem(f"{OVERRIDES_KEY}.zero_optimization.{key}", zero[key], f"contradicts parallel={par.name} (parallel.{flag}={getattr(par, flag)})", f"pick the offload with parallel={option} (or without), and remove the override"))
    return problems


def _offloads(block) -> bool:
    return hasattr(block, "get") and block.get("device", "none") not in ("none", None)


def stage_problems(par, trains_here: bool) -> list[Problem]:
    """The ZeRO stage and offloads, and (`trains_here`: mode=train) a CUDA GPU to run on."""
    problems = []
    if par.zero_stage not in (1, 2, 3):
        problems.append(Problem("parallel.zero_stage", par.zero_stage, "must be 1, 2 or 3", f"pick {ZERO_OPTIONS}"))
    if par.offload_params and par.zero_stage != 3:
        problems.append(Problem("parallel.offload_params", True, f"parameter offload needs ZeRO stage 3 (got {par.zero_stage})", "use parallel=zero3_offload"))
    if trains_here and not par.deepspeed_on_cpu and _no_cuda():
        problems.append(
            Problem(
                "parallel",
                par.name,
                "Lightning's DeepSpeedStrategy runs only on CUDA GPUs and this machine has none (parallel.deepspeed_on_cpu=true runs it on CPU for tests only: slow, and proves nothing about NCCL or GPU memory)",
                "plan it here with mode=plan hardware.gpu=A800 (or V100), train it on a GPU node, or use "
                + ("parallel=fsdp_tp parallel.tp=1 on CPU (its context parallelism runs over gloo)" if (par.cp or 1) > 1 else "parallel=ddp on CPU"),
            )
        )
    return problems


def _no_cuda() -> bool:
    import torch

    return not torch.cuda.is_available()


def finetune_problems(par, finetune_cfg) -> list[Problem]:
    if par.zero_stage == 1 and finetune_cfg.method.value == "lora":
        # DeepSpeed saves frozen weights for its consolidation (zero_to_fp32) only from stage 2 on.
        return [Problem("parallel", par.name, "finetune=lora under ZeRO-1: DeepSpeed's ZeRO-1 checkpoints leave the frozen base out of what its consolidation reads, so nothing could be exported", "use parallel=zero2 (for a LoRA run it needs the same memory: the optimizer state is the adapters') or parallel=ddp")]
    return []


# DeepSpeed's reduce bucket defaults to 5e8 elements, and ZeRO allocates it whatever the model:
# stages 1 and 2 two of them (overlap_comm's double buffer) for every backward, stage 3 one for the
# run: 2 GB of bf16 beside a model of any size (stages 1 and 2 through each backward). Transformers' "auto"
# sizes it hidden^2 (transformers/integrations/deepspeed.py); the floor keeps one bucket for a
# small model's gradients (and few reduce calls) at 32 MiB of bf16.
REDUCE_BUCKET_FLOOR = 2**24


def sized_reduce_bucket(hidden: int) -> int:
    """Elements of the reduce bucket tinytrain's config asks for: max(hidden^2, REDUCE_BUCKET_FLOOR)."""
    return max(hidden * hidden, REDUCE_BUCKET_FLOOR)


def reduce_bucket(parallel_cfg, hidden: int) -> int:
    """Elements of ZeRO's reduce bucket as the run gets it: an override's, else sized_reduce_bucket.
    An override that is not a number is counted at the sized one here: build() refuses it, naming it."""
    overrides = parallel_cfg.deepspeed_overrides or {}
    zero = overrides.get("zero_optimization") or {}
    try:
        return int(float(zero.get("reduce_bucket_size")))
    except (TypeError, ValueError):
        return sized_reduce_bucket(hidden)


def bucket_bytes(zero_stage: int, elements: int, element_bytes: int) -> float:
    """What ZeRO's reduce buckets hold on a GPU (deepspeed/runtime/zero stage_1_and_2.py setup_buckets,
    stage3.py's ipg buffer): two under stages 1 and 2 (overlap_comm), one under stage 3."""
    return float((1 if zero_stage == 3 else 2) * elements * element_bytes)


def generate(parallel_cfg, batch: BatchPlan, precision: PrecisionDecision, grad_clip: float, cp: int = 1, muon: bool = False, hidden: int = 0) -> dict:
    zero: dict = {"stage": parallel_cfg.zero_stage, "overlap_comm": True, "contiguous_gradients": True, "reduce_bucket_size": sized_reduce_bucket(hidden)}
    if parallel_cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    if parallel_cfg.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    if parallel_cfg.zero_stage == 3:
        # Lets a stage-3 checkpoint be turned into one full state dict (export, TP-free reload).
        zero["stage3_gather_16bit_weights_on_model_save"] = True
        if muon:  # DeepSpeed 0.19's stage 3 refuses MuonWithAuxAdam with reduce_scatter (its default)
            zero["reduce_scatter"] = False
    ds = {
        "train_micro_batch_size_per_gpu": batch.micro_batch_size,
        "gradient_accumulation_steps": batch.accumulate_grad_batches,
        # DeepSpeed counts every rank as data-parallel: under context parallelism the cp ranks of a
        # group each hold a slice of the same rows, so its sum is cp x the global batch.
        "train_batch_size": batch.global_batch_size * cp,
        "gradient_clipping": grad_clip,
        "zero_optimization": zero,
        "steps_per_print": 10**9,  # tinytrain logs metrics itself
        "wall_clock_breakdown": False,
    }
    if precision.dtype is Dtype.bf16:
        ds["bf16"] = {"enabled": True}
    elif precision.is_fp16:
        ds["fp16"] = precision.loss_scale.to_deepspeed()
    if parallel_cfg.offload_optimizer:
        # Lightning builds the optimizer from configure_optimizers; with offload it must be
        # DeepSpeed's CPU Adam (the module picks it), which DeepSpeed otherwise insists on too.
        # Under muon it is MuonWithAuxAdam, whose offloaded partitions DeepSpeed orthogonalises
        # itself (_apply_muon_updates_cpu_offload) and steps as torch code: allowed by this flag only.
        ds["zero_force_ds_cpu_optimizer"] = not muon
    return ds


def load_universal(ds: dict) -> dict:
    """`ds` loading a universal checkpoint (a resume on another data-parallel size, converted
    by checkpoint/universal.py): DeepSpeed reads `latest_universal` and the per-parameter fp32
    master weights and moments, and re-partitions them over this run's ranks."""
    return {**ds, "checkpoint": {**ds.get("checkpoint", {}), "load_universal": True}}


def for_lightning(ds: dict) -> dict:
    """The config handed to Lightning's DeepSpeedStrategy: Lightning sets
    gradient_accumulation_steps itself (from Trainer.accumulate_grad_batches) and refuses a
    config that has it, so the strategy gets a copy without it. deepspeed_config.json keeps it:
    it is what DeepSpeed runs with."""
    return {k: copy.deepcopy(v) for k, v in ds.items() if k != "gradient_accumulation_steps"}


def flatten(d: dict, prefix: str = "") -> list[tuple[str, object]]:
    items = []
    for key, value in d.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, dict) and value:
            items += flatten(value, path)
        else:
            items.append((path, value))
    return items


def set_path(d: dict, dotted: str, value) -> None:
    *parents, leaf = dotted.split(".")
    for part in parents:
        if not isinstance(d.get(part), dict):
            d[part] = {}
        d = d[part]
    d[leaf] = value


def merge_overrides(base: dict, overrides: dict) -> dict:
    merged = copy.deepcopy(base)
    for path, value in flatten(overrides):
        set_path(merged, path, value)
    return merged


class _TrackingDict(dict):
    """Records which top-level keys DeepSpeed's config class reads, to find the ones it ignores."""

    def __init__(self, data):
        super().__init__(data)
        self.read: set[str] = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def deepspeed_problem(ds: dict, data_parallel: int) -> tuple[str, str] | None:
    """(what is wrong, DeepSpeed's message) or None. DeepSpeed's class sees a world of one
    process without a process group, so it checks the per-process batch; tinytrain checked the
    global arithmetic already."""
    from deepspeed.runtime.config import DeepSpeedConfig

    per_process = dict(ds)
    if isinstance(ds.get("train_batch_size"), int) and data_parallel > 1:
        if ds["train_batch_size"] % data_parallel:
            return "train_batch_size", f"{ds['train_batch_size']} is not divisible by the data-parallel size {data_parallel}"
        per_process["train_batch_size"] = ds["train_batch_size"] // data_parallel
    clip = ds.get("gradient_clipping", 0.0)
    if isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0:
        return "gradient_clipping", f"must be a non-negative number, got {clip!r}"
    tracking = _TrackingDict(per_process)
    try:
        DeepSpeedConfig(tracking)
    except Exception as e:  # noqa: BLE001 - DeepSpeed raises AssertionError, ValueError, pydantic errors
        return "config", " ".join(str(e).split())[:400]
    ignored = sorted(set(per_process) - tracking.read)
    if ignored:
        close = difflib.get_close_matches(ignored[0], sorted(tracking.read), n=1)
        hint = f" (did you mean '{close[0]}'?)" if close else ""
        return ignored[0], f"unknown top-level key '{ignored[0]}': DeepSpeed would silently ignore it{hint}"
    return None


def build(parallel_cfg, batch: BatchPlan, precision: PrecisionDecision, grad_clip: float, cp: int = 1, muon: bool = False, hidden: int = 0) -> dict:
    """The validated DeepSpeed config for this run, overrides applied; `cp`: the plan's context-parallel
    size; `muon`: trainer.optimizer=muon (MuonWithAuxAdam, also on offloaded partitions); `hidden`:
    the model's hidden size, which sizes the reduce bucket (REDUCE_BUCKET_FLOOR)."""
    base = generate(parallel_cfg, batch, precision, grad_clip, cp, muon, hidden)
    ranks = batch.data_parallel * cp  # what DeepSpeed sees as its data-parallel world
    if (problem := deepspeed_problem(base, ranks)) is not None:
        raise ConfigError(Problem("parallel", parallel_cfg.name, f"generated DeepSpeed config rejected: {problem[1]}", "report this as a tinytrain bug"))
    from omegaconf import DictConfig, OmegaConf

    overrides = parallel_cfg.deepspeed_overrides
    if isinstance(overrides, DictConfig):
        overrides = OmegaConf.to_container(overrides, resolve=True)
    # Apply one leaf at a time so the error names the override that broke it.
    current = base
    for path, value in flatten(overrides):
        candidate = merge_overrides(current, _nest(path, value))
        if (problem := deepspeed_problem(candidate, ranks)) is not None:
            raise ConfigError(
                Problem(
                    f"{OVERRIDES_KEY}.{path}",
                    value,
                    f"DeepSpeed rejects the config with this override: {problem[1]}",
                    f"fix or remove {OVERRIDES_KEY}.{path}; the generated config without overrides is in plan.json ('deepspeed')",
                )
            )
        current = candidate
    return current


def _nest(dotted: str, value) -> dict:
    out: dict = {}
    set_path(out, dotted, value)
    return out

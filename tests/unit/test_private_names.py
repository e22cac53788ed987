"""The private names of Lightning, torch, Hydra, transformers, datasets, OmegaConf and DeepSpeed that
tinytrain relies on still exist, in the shape tinytrain uses them.

Upstream may move or rename a `_name` in any release without notice; tinytrain's ranges in
pyproject.toml let a cluster install newer releases. This test fails naming the package, its
installed version, the name and the tinytrain module that uses it, instead of a run failing with
an AttributeError on the cluster.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect

import pytest


def module_attr(module: str, name: str):
    return lambda: getattr(importlib.import_module(module), name)


def class_attr(module: str, cls: str, name: str):
    return lambda: getattr(getattr(importlib.import_module(module), cls), name)


def assigned_in_init(module: str, cls: str, name: str):
    """An instance attribute: the class's __init__ (or its parents') assigns self.<name>."""

    def check():
        klass = getattr(importlib.import_module(module), cls)
        sources = [inspect.getsource(vars(k)["__init__"]) for k in klass.__mro__ if inspect.isfunction(vars(k).get("__init__"))]
        if not any(f"self.{name} =" in src or f"self.{name}:" in src for src in sources):
            raise AttributeError(f"{cls}.__init__ no longer sets self.{name}")

    return check


def has_parameters(get, *names: str):
    def check():
        params = inspect.signature(get()).parameters
        missing = [n for n in names if n not in params]
        if missing:
            raise AttributeError(f"signature {tuple(params)} lacks {missing}")

    return check


def dataclass_field(module: str, cls: str, name: str):
    def check():
        fields = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), cls))}
        if name not in fields:
            raise AttributeError(f"{cls} has no field {name} (fields: {sorted(fields)})")

    return check


def since(distribution: str, version: str, check):
    """`check` where the installed release is `version` or newer; an older one predates the name."""

    def checked():
        from packaging.version import Version

        if Version(importlib.metadata.version(distribution)) >= Version(version):
            check()

    return checked


def source_mentions(get, text: str):
    def check():
        if text not in inspect.getsource(get()):
            raise AttributeError(f"no longer reads {text!r}")

    return check


LIGHTNING_STRATEGIES = "lightning.pytorch.strategies"
FLASH_UTILS = "transformers.modeling_flash_attention_utils"

# (distribution, the private name, the tinytrain module relying on it, the check)
PRIVATE_NAMES = [
    ("lightning", "fabric.strategies.model_parallel._load_raw_module_state", "train/sharded_checkpoints.py (fsdp_tp resume from a file re-pads vocab rows)", module_attr("lightning.fabric.strategies.model_parallel", "_load_raw_module_state")),
    ("torch", "distributed.checkpoint._traverse.set_element", "checkpoint/sharded.py (DCP's param groups loaded with weights_only)", module_attr("torch.distributed.checkpoint._traverse", "set_element")),
    ("torch", "DefaultLoadPlanner.load_bytes", "checkpoint/sharded.py (overridden: weights_only)", class_attr("torch.distributed.checkpoint.default_planner", "DefaultLoadPlanner", "load_bytes")),
    ("torch", "DefaultLoadPlanner.original_state_dict/mappings", "checkpoint/sharded.py", assigned_in_init("torch.distributed.checkpoint.default_planner", "DefaultLoadPlanner", "flatten_state_dict")),
    ("lightning", "DeepSpeedStrategy._init_deepspeed_distributed", "train/strategy.py (DeepSpeed on CPU)", class_attr(LIGHTNING_STRATEGIES, "DeepSpeedStrategy", "_init_deepspeed_distributed")),
    (
        "lightning",
        "DeepSpeedStrategy._setup_model_and_optimizer(model, optimizer, lr_scheduler)",
        "train/strategy.py (DeepSpeed on CPU overrides it)",
        has_parameters(class_attr(LIGHTNING_STRATEGIES, "DeepSpeedStrategy", "_setup_model_and_optimizer"), "model", "optimizer", "lr_scheduler"),
    ),
    ("lightning", "Trainer._logger_connector", "train/metrics_csv.py (the step's row before its checkpoint)", assigned_in_init("lightning.pytorch", "Trainer", "_logger_connector")),
    ("lightning", "_TrainingEpochLoop._batches_that_stepped", "train/callbacks/accumulation_change.py (a row's step after a resume), model/module.py (the last step's row)", assigned_in_init("lightning.pytorch.loops.training_epoch_loop", "_TrainingEpochLoop", "_batches_that_stepped")),
    ("lightning", "_LoggerConnector.should_update_logs", "train/metrics_csv.py", class_attr("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector", "should_update_logs")),
    ("lightning", "_LoggerConnector.metrics", "train/metrics_csv.py", class_attr("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector", "metrics")),
    ("lightning", "_LoggerConnector.log_metrics", "train/metrics_csv.py", class_attr("lightning.pytorch.trainer.connectors.logger_connector.logger_connector", "_LoggerConnector", "log_metrics")),
    ("lightning", "csv_logs.ExperimentWriter._check_log_dir_exists", "train/metrics_csv.py (keeps metrics.csv on resume)", class_attr("lightning.pytorch.loggers.csv_logs", "ExperimentWriter", "_check_log_dir_exists")),
    ("lightning", "csv_logs.ExperimentWriter._rewrite_with_new_header", "train/metrics_csv.py (a new column rewrites metrics.csv beside itself)", class_attr("lightning.pytorch.loggers.csv_logs", "ExperimentWriter", "_rewrite_with_new_header")),
    ("lightning", "CSVLogger._experiment", "train/metrics_csv.py", assigned_in_init("lightning.pytorch.loggers", "CSVLogger", "_experiment")),
    ("lightning", "_ChildProcessObserver._finished", "cluster/watched_rank.py hold_off_lightning_observer (a dead rank's message, a hang verdict's exit 76)", assigned_in_init("lightning.fabric.strategies.launchers.subprocess_script", "_ChildProcessObserver", "_finished")),
    ("lightning", "_ChildProcessObserver._child_processes", "cluster/watched_rank.py hold_off_lightning_observer (rebound empty: its next look finds no child to kill for)", assigned_in_init("lightning.fabric.strategies.launchers.subprocess_script", "_ChildProcessObserver", "_child_processes")),
    (
        "lightning",
        "_ChildProcessObserver's thread name child-process-observer",
        "cluster/watched_rank.py hold_off_lightning_observer (finds the thread by it)",
        source_mentions(module_attr("lightning.fabric.strategies.launchers.subprocess_script", "_ChildProcessObserver"), '"child-process-observer"'),
    ),
    ("torch", "ParallelStyle._apply", "model/tensor_parallel.py (head_norm_parallel, a style of its own)", class_attr("torch.distributed.tensor.parallel", "ParallelStyle", "_apply")),
    ("torch", "distributed.tensor.experimental._attention._ContextParallel.AttentionType.FLEX", "model/ring_attention.py (torch's context parallel, flex path)", class_attr("torch.distributed.tensor.experimental._attention", "_ContextParallel", "AttentionType")),
    ("torch", "distributed.tensor.experimental._attention._context_parallel_shard(mesh, buffers, seq_dims, load_balancer)", "model/ring_attention.py", has_parameters(module_attr("torch.distributed.tensor.experimental._attention", "_context_parallel_shard"), "mesh", "buffers", "seq_dims", "load_balancer")),
    ("torch", "distributed.tensor.experimental._context_parallel._attention._create_cp_block_mask(mask_mod, B, H, Q_LEN, KV_LEN, device_mesh, load_balancer)", "model/ring_attention.py (a rank's block mask, no dense whole-sequence mask)", has_parameters(module_attr("torch.distributed.tensor.experimental._context_parallel._attention", "_create_cp_block_mask"), "mask_mod", "B", "H", "Q_LEN", "KV_LEN", "device_mesh", "load_balancer")),
    ("torch", "distributed._functional_collectives.all_reduce(self, reduceOp, group)", "model/context_parallel.py (group_mean_loss: the cp group's differentiable sum)", has_parameters(module_attr("torch.distributed._functional_collectives", "all_reduce"), "self", "reduceOp", "group")),
    ("torch", "distributed._functional_collectives.AsyncCollectiveTensor", "model/tensor_parallel.py (plain_output: the embedding's all-reduced output made plain before compiled blocks)", module_attr("torch.distributed._functional_collectives", "AsyncCollectiveTensor")),
    ("torch", "distributed.tensor.experimental._attention._HeadTailLoadBalancer", "model/ring_attention.py (head-tail sharding of the causal sequence)", module_attr("torch.distributed.tensor.experimental._attention", "_HeadTailLoadBalancer")),
    ("torch", "torch._foreach_norm", "train/callbacks/nonfinite_guard.py", module_attr("torch", "_foreach_norm")),
    ("torch", "torch.distributed.tensor._redistribute (logger name)", "train/trainer.py (quiet_lightning)", lambda: importlib.import_module("torch.distributed.tensor._redistribute")),
    ("hydra-core", "JobReturn._return_value", "cluster/sweep_results.py (a failed job's exception)", dataclass_field("hydra.core.utils", "JobReturn", "_return_value")),
    ("omegaconf", "DictConfig._get_node", "config/checks.py (unknown keys at any depth)", class_attr("omegaconf", "DictConfig", "_get_node")),
    ("datasets", "Dataset._fingerprint", "data/sources.py (an hf source's content key)", assigned_in_init("datasets", "Dataset", "_fingerprint")),
    ("transformers", "PretrainedConfig._attn_implementation", "model/packed_attention.py", class_attr("transformers", "PretrainedConfig", "_attn_implementation")),
    *[
        ("transformers", f"modeling_flash_attention_utils.{name}", "model/flash_reference.py (the CPU stand-in for flash-attn)", module_attr(FLASH_UTILS, name))
        for name in ("_flash_fn", "_flash_varlen_fn", "_flash_with_kvcache_fn", "_pad_fn", "_unpad_fn", "_pad_input", "_unpad_input", "_process_flash_kwargs_fn", "_lazy_define_process_function", "_loaded_implementation")
    ],
    # Newer than 5.17 (the GPU image's, our oldest): set there too, where nothing reads it.
    ("transformers", "modeling_flash_attention_utils._process_with_kvcache_kwargs_fn (5.23)", "model/flash_reference.py (the CPU stand-in for flash-attn)", since("transformers", "5.23", module_attr(FLASH_UTILS, "_process_with_kvcache_kwargs_fn"))),
    ("deepspeed", "runtime.fp16.loss_scaler.DynamicLossScaler / LossScaler", "checkpoint/safe_load.py (globals of ZeRO shards)", module_attr("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler")),
    ("deepspeed", "runtime.zero.config.ZeroStageEnum", "checkpoint/safe_load.py", module_attr("deepspeed.runtime.zero.config", "ZeroStageEnum")),
    ("deepspeed", "utils.tensor_fragment.fragment_address", "checkpoint/safe_load.py", module_attr("deepspeed.utils.tensor_fragment", "fragment_address")),
    ("deepspeed", "accelerator.cpu_accelerator.CPU_Accelerator.is_fp16_supported", "train/strategy.py (fp16 on DeepSpeed's CPU accelerator)", class_attr("deepspeed.accelerator.cpu_accelerator", "CPU_Accelerator", "is_fp16_supported")),
    ("deepspeed", "initialize(args.device_rank)", "train/strategy.py (DeepSpeed on CPU passes the rank this way)", source_mentions(module_attr("deepspeed.runtime.engine", "DeepSpeedEngine"), "device_rank")),
    ("lm-eval", "models.utils._add_special_kwargs", "train/eval_lm.py (tokenizes as lm-eval's hf model)", module_attr("lm_eval.models.utils", "_add_special_kwargs")),
    ("lm-eval", "tasks._index.Kind", "plan/eval_tasks.py (a group or tag expanded to its tasks)", module_attr("lm_eval.tasks._index", "Kind")),
    ("lm-eval", "tasks._yaml_loader.load_yaml", "plan/eval_tasks.py (an included YAML's dataset_path; the eval.include YAMLs lm-eval skips, named)", module_attr("lm_eval.tasks._yaml_loader", "load_yaml")),
    ("lm-eval", "evaluator.add_env_info, called by simple_evaluate", "train/callbacks/evals.py (the machine report left out of each scoring)", source_mentions(module_attr("lm_eval.evaluator", "simple_evaluate"), "add_env_info")),
    ("lm-eval", "simple_evaluate returns results where LOCAL_RANK is 0", "train/callbacks/evals.py (every rank sets LOCAL_RANK=0 for the scoring)", source_mentions(module_attr("lm_eval.evaluator", "simple_evaluate"), "LOCAL_RANK")),
]


@pytest.mark.parametrize(("distribution", "name", "used_by", "check"), PRIVATE_NAMES, ids=[f"{d}:{n}" for d, n, _, _ in PRIVATE_NAMES])
def test_private_name_still_there(distribution, name, used_by, check):
    try:
        check()
    except (AttributeError, ImportError, TypeError, OSError) as e:
        pytest.fail(
            f"upstream change: {distribution} {importlib.metadata.version(distribution)} moved or changed the private name `{name}` "
            f"that tinytrain/{used_by} relies on ({type(e).__name__}: {e}). Adapt that module, or cap {distribution} in pyproject.toml.",
            pytrace=False,
        )

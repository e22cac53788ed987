"""Entry point: `python -m tinytrain key=value ...` wires the stages and nothing else.

compose (Hydra) -> validate -> resolve -> [mode=prepare: build the data and stop] -> plan -> build + fit (mode=train only).
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from tinytrain.config.resolvers import register_resolvers
from tinytrain.config.schema import Mode, register_schemas

CONF_DIR = Path(__file__).resolve().parent.parent / "conf"
log = logging.getLogger("tinytrain")


def is_rank_zero() -> bool:
    # Set by torchrun / Lightning's DDP launcher / srun before this process starts.
    for var in ("RANK", "SLURM_PROCID", "LOCAL_RANK"):
        if var in os.environ:
            return int(os.environ[var]) == 0
    return True


def run_stages(cfg: DictConfig, run_dir: Path) -> dict:
    from tinytrain.model import choose_attention, count_parameters, flash_attn_installed, hf_config, pretrained_config
    from tinytrain.plan import build_plan, render_plan, write_plan
    from tinytrain.resolve import resolve
    from tinytrain.tokenizer import load_from_config
    from tinytrain.validate import validate

    validate(cfg)
    tokenizer = load_from_config(cfg.tokenizer)
    resolved = resolve(cfg, tokenizer)
    if cfg.mode == Mode.prepare:
        return prepare_data(cfg, tokenizer, resolved)
    attention = choose_attention(cfg.model.attention, flash_attn_installed(), on_gpu=not resolved.hardware.is_cpu)
    if cfg.model.pretrained:
        model_config = pretrained_config(cfg.model.pretrained)
        model_config.vocab_size = resolved.vocab.padded
        model_config.use_cache = False
    else:
        model_config = hf_config(cfg.model, resolved.vocab.padded, tokenizer)
    plan = build_plan(cfg, resolved, count_parameters(model_config), attention, cfg.model.name)
    if is_rank_zero():
        run_dir.mkdir(parents=True, exist_ok=True)
        write_plan(plan, run_dir)
        (run_dir / "config_resolved.yaml").write_text(OmegaConf.to_yaml(cfg, resolve=True))
        print(render_plan(plan), flush=True)
    if cfg.mode == Mode.plan:
        if is_rank_zero():
            print(f"plan written to {run_dir / 'plan.json'}")
        return {"plan": plan}

    from tinytrain.train import fit

    return fit(cfg, run_dir, tokenizer, resolved, model_config, attention)


def prepare_data(cfg: DictConfig, tokenizer, resolved) -> dict:
    """Build what training reads (the token store; SFT samples are tokenized and counted) and stop."""
    from tinytrain.data.datamodule import DataModule

    data = DataModule(cfg.data, tokenizer, resolved.batch.micro_batch_size, cfg.seed, progress=is_rank_zero(), data_parallel=resolved.batch.data_parallel)
    if is_rank_zero():
        print(data.describe(), flush=True)
    return {"data": data}


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def hydra_main(cfg: DictConfig):
    from hydra.core.hydra_config import HydraConfig

    from tinytrain.errors import ConfigError

    run_dir = Path(HydraConfig.get().runtime.output_dir)
    try:
        result = run_stages(cfg, run_dir)
    except ConfigError as e:
        if os.environ.get("TINYTRAIN_TRACEBACK") == "1":
            raise
        print(f"{e.render()}\n(set HYDRA_FULL_ERROR=1 for the traceback)", file=sys.stderr)
        sys.exit(2)
    # Hydra multirun sweepers optimise the task's return value.
    return result.get("val_loss")


def main() -> None:
    from tinytrain.friendly_errors import friendly_message

    register_resolvers()
    register_schemas()
    # Hydra prints a trimmed traceback for every error; tinytrain prints one paragraph naming
    # the key, the value and the fix instead. Users who want the traceback set HYDRA_FULL_ERROR=1
    # (remembered across the processes a DDP launcher starts).
    os.environ.setdefault("TINYTRAIN_TRACEBACK", os.environ.get("HYDRA_FULL_ERROR", "0"))
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        hydra_main()
    except Exception as e:  # noqa: BLE001 - every exception is either explained or re-raised
        message = friendly_message(e, sys.argv[1:])
        if message is None or os.environ["TINYTRAIN_TRACEBACK"] == "1":
            raise
        print(message, file=sys.stderr)
        sys.exit(2)

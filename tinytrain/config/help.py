"""`tinytrain --help`: tinytrain's own help (modes, the config groups shipped in tinytrain/conf/ and
their options, the keys most runs set, where the docs say more) instead of Hydra's, which lists
the ConfigStore's internal nodes too. `--hydra-help` still shows Hydra's flags."""

from __future__ import annotations

from pathlib import Path

import tinytrain
from tinytrain.config import CONF_DIR
from tinytrain.config.schema import Mode

# The keys most runs set, with what they do (defaults are read from the composed config).
COMMON_KEYS = {
    "trainer.max_steps": "optimizer steps",
    "trainer.lr": "peak learning rate (warm-up + cosine)",
    "trainer.micro_batch_size": "sequences per device per forward",
    "trainer.global_batch_size": "sequences per optimizer step (null: micro x data-parallel)",
    "data.seq_len": "tokens per sequence",
    "data.path": "a file or folder for data=text|jsonl|alpaca|chat",
    "tokenizer.path": "a tokenizer.model or a Hugging Face tokenizer folder (tokenizer=bundled: the package's)",
    "model.pretrained": "a local Hugging Face model folder to fine-tune",
    "cluster.nodes": "nodes",
    "cluster.devices": "processes (GPUs) per node (null: every visible GPU, or 1 on CPU)",
    "parallel.tp": "tensor-parallel size (parallel=fsdp_tp)",
    "hardware.gpu": "plan for this GPU instead of the local one (V100, A800, H100-SXM, ...)",
    "run.name": "the run directory under run.root (slurm-<job id> under Slurm, else the start time; ranks torchrun starts must be given one)",
    "resume": "auto | never | <checkpoint>",
}

MODES = {
    Mode.train: "plan, then train (default)",
    Mode.plan: "print and write the plan (vocab, precision, memory, DeepSpeed config); no weights, no GPU",
    Mode.prepare: "build the token store and stop",
    Mode.sbatch: "plan, then write <run dir>/job.sbatch for Slurm",
    Mode.export: "a Hugging Face folder from checkpoint=<path>",
    Mode.generate: "text from checkpoint=<path> for generate.prompts",
    Mode.eval: "loss and perplexity of checkpoint=<path> -> eval.json",
    Mode.average: "the mean weights of checkpoints=[a,b,...] (or checkpoint.average_last=<k>) -> a checkpoint and its export",
    Mode.health: "the health check alone on every rank (matmul, memory, all-reduce) -> health.json",
    Mode.doctor: "versions, GPUs, Slurm allocation, network and NCCL variables in one report for a bug report -> doctor.txt",
}

# The reference pages in the repository's docs/ (`mkdocs serve` shows them as a site).
DOC_PAGES = ("planning.md", "configuration.md", "parallelism.md", "slurm.md", "checkpoints.md", "errors.md")


def group_options(conf_dir: Path = CONF_DIR) -> dict[str, list[str]]:
    """Each config group shipped with tinytrain and its options (the YAML files in its folder)."""
    groups = {}
    for folder in sorted(p for p in conf_dir.rglob("*") if p.is_dir()):
        options = sorted(f.stem for f in folder.glob("*.yaml"))
        if options:
            groups[folder.relative_to(conf_dir).as_posix()] = options
    return groups


def render(defaults, conf_dir: Path = CONF_DIR) -> str:
    """The help text; `defaults` is the default config composed with its Hydra node (the chosen
    options are hydra.runtime.choices; the keys' defaults are read from it)."""
    from omegaconf import OmegaConf

    choices = defaults.hydra.runtime.choices

    lines = [
        f"tinytrain {tinytrain.__version__}: declarative pretraining and fine-tuning of Llama-family models",
        "",
        "usage: tinytrain [key=value ...]      (or python -m tinytrain ...)",
        "       tinytrain -m key=a,b ...       a sweep (Hydra multirun)",
        "       tinytrain --version | --help | --hydra-help | --cfg job (the composed config)",
        "",
        "modes (mode=...):",
        *(f"  {m.value:<10} {what}" for m, what in MODES.items()),
        "",
        "config groups (group=option; default in [brackets]):",
    ]
    for group, options in group_options(conf_dir).items():
        chosen = choices.get(group)
        shown = ", ".join(f"[{o}]" if o == chosen else o for o in options)
        lines.append(f"  {group:<16} {shown}")
    lines += ["", "keys most runs set (key=value; any key of tinytrain/config/schema.py can be set):"]
    raw = OmegaConf.to_container(defaults, resolve=False)  # ${...} as written, not this machine's values
    for key, what in COMMON_KEYS.items():
        value = raw
        for part in key.split("."):
            value = value[part]
        shown = "null" if value is None else "derived" if str(value).startswith("${") else value
        lines.append(f"  {key:<26} {what} [{shown}]")
    lines += [
        "",
        "examples:",
        "  tinytrain mode=plan model=tinyllama_1b tokenizer=llama2 tokenizer.path=<folder> hardware.gpu=A800",
        "  tinytrain experiment=smoke logger=[wandb,tensorboard]          (loggers combine; metrics.csv is always written)",
        "  tinytrain --config-dir ./my_conf model=my_model      (your own groups on top of tinytrain's)",
        "",
        "exit codes: 0 done, 2 configuration error, 3 stopped by a guard, 75 checkpointed on a signal (run again to resume), 76 stopped by the hang watchdog (hang_report.txt)",
        "more in the repository's docs/ (mkdocs serve shows them as a site):",
        *(f"  docs/{page}" for page in DOC_PAGES),
    ]
    return "\n".join(lines)


def default_config():
    """The default config as `tinytrain` with no overrides composes it (resolvers and schemas registered)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="config", return_hydra_config=True)

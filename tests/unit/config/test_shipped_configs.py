"""Every shipped config composes, validates and plans (in-process, meta-device parameter counts)."""


import pytest

from tests.conftest import CONF_DIR, LLAMA2_TOKENIZER, plan


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


# Analytic counts: embeddings + lm_head (unless tied) + per layer (attention + MLP + norms) + final norm.
def expected_params(h, layers, heads, kv, inter, vocab, tied=False, qkv_bias=False, head_dim=None, norms=2, qk_norm=False):
    head_dim = head_dim or h // heads
    q, k = heads * head_dim, kv * head_dim
    attn = h * q + 2 * h * k + q * h + (q + 2 * k if qkv_bias else 0)
    per_layer = attn + 3 * h * inter + norms * h + (2 * head_dim if qk_norm else 0)
    return vocab * h * (1 if tied else 2) + layers * per_layer + h


# hidden, layers, heads, kv heads, intermediate, tied, q/k/v bias[, head_dim, norms per layer, q/k head norms]
MODELS = {
    "tiny": (192, 4, 6, 2, 512, False, False),
    "tinyllama_1b": (2048, 22, 32, 4, 5632, False, False),
    "llama2_7b": (4096, 32, 32, 32, 11008, False, False),
    "llama3_8b": (4096, 32, 32, 8, 14336, False, False),
    "llama3_1_8b": (4096, 32, 32, 8, 14336, False, False),
    "yi_6b": (4096, 32, 32, 4, 11008, False, False),
    "qwen2_0_5b": (896, 24, 14, 2, 4864, True, True),
    "qwen2_5_0_5b": (896, 24, 14, 2, 4864, True, True),
    "qwen2_5_7b": (3584, 28, 28, 4, 18944, False, True),
    "mistral_7b": (4096, 32, 32, 8, 14336, False, False),
    "gemma2_2b": (2304, 26, 8, 4, 9216, True, False, 256, 4),
    "phi3_mini": (3072, 32, 32, 32, 8192, False, False),
    "qwen3_0_6b": (1024, 28, 16, 8, 3072, True, False, 128, 2, True),
    "qwen3_8b": (4096, 36, 32, 8, 12288, False, False, 128, 2, True),
    "gemma3_1b": (1152, 26, 4, 1, 6912, True, False, 256, 4, True),
    "gemma3_4b": (2560, 34, 8, 4, 10240, True, False, 256, 4, True),
}
# Published parameter counts with each model's own vocab rows (model card / safetensors totals).
PUBLISHED = {
    "mistral_7b": (32000, 7_241_732_096),
    "qwen2_5_0_5b": (151936, 494_032_768),
    "qwen2_5_7b": (152064, 7_615_616_512),
    "llama3_1_8b": (128256, 8_030_261_248),
    "gemma2_2b": (256000, 2_614_341_888),
    "phi3_mini": (32064, 3_821_079_552),
    # Qwen3 model cards: 0.6B (0.44B non-embedding), 8.2B (6.95B non-embedding); Gemma-3: 1B, and
    # 4B of which the language model is ~3.88B (the rest the SigLIP vision tower).
    "qwen3_0_6b": (151936, 596_049_920),
    "qwen3_8b": (151936, 8_190_735_360),
    "gemma3_1b": (262144, 999_885_952),
    "gemma3_4b": (262208, 3_880_263_168),
}
# The model cards' figures the exact counts above are checked against: (total, without the
# embedding tables), in billions, to the digits the cards give.
CARDS = {"qwen3_0_6b": (0.6, 0.44), "qwen3_8b": (8.2, 6.95), "gemma3_1b": (1.0, None), "gemma3_4b": (3.9, None)}


def test_every_model_config_is_covered():
    assert set(options("model")) == set(MODELS)


@pytest.mark.parametrize("model", options("model"))
def test_model_plans_with_bundled_tokenizer(model, tmp_path):
    p = plan([f"model={model}"], tmp_path)
    assert p["vocab"] == {"true": 4096, "padded": 4096, "multiple": 64, "tp": 1, "padding_rows": 0}
    assert p["params"]["total"] == expected_params(*MODELS[model][:5], 4096, *MODELS[model][5:])
    assert (tmp_path / "plan.json").exists() and (tmp_path / "config_resolved.yaml").exists()


@pytest.mark.parametrize("model", sorted(PUBLISHED))
def test_family_presets_match_the_published_sizes(model):
    """The shapes, counted with each model's own vocab, give the sizes the model cards publish."""
    vocab, published = PUBLISHED[model]
    assert expected_params(*MODELS[model][:5], vocab, *MODELS[model][5:]) == published


@pytest.mark.parametrize("model", sorted(CARDS))
def test_new_family_presets_match_their_model_cards(model):
    vocab, exact = PUBLISHED[model]
    total, non_embedding = CARDS[model]
    h, tied = MODELS[model][0], MODELS[model][5]
    digits = len(str(total).split(".")[1])
    assert round(exact / 1e9, digits) == total
    if non_embedding is not None:
        assert round((exact - vocab * h * (1 if tied else 2)) / 1e9, 2) == non_embedding


def test_tinyllama_matches_the_published_size(tmp_path):
    if not LLAMA2_TOKENIZER.exists():
        pytest.skip("../shared/data/llama2-tokenizer absent")
    p = plan(["model=tinyllama_1b", "tokenizer=llama2"], tmp_path)
    assert p["params"]["total"] == 1_100_048_384  # TinyLlama-1.1B's parameter count


@pytest.mark.parametrize(
    "group, option",
    [(g, o) for g in ("tokenizer", "data", "precision", "parallel", "trainer", "logger", "cluster") for o in options(g)],
)
def test_group_option_plans(group, option, tmp_path):
    needs_shared = (group, option) in {("tokenizer", "llama2"), ("data", "text"), ("data", "jsonl"), ("data", "alpaca"), ("data", "mixture")}
    if needs_shared and not LLAMA2_TOKENIZER.exists():
        pytest.skip("../shared/data absent")
    extra = ["cluster.devices=2"] if (group, option) in {("parallel", "ddp"), ("parallel", "fsdp_tp")} else []
    if (group, option) == ("precision", "bf16"):
        extra = ["hardware.gpu=A800"]
    if (group, option) == ("cluster", "slurm"):  # 1 node x 8 GPUs on a login node: one process per GPU
        extra = ["parallel=ddp"]
    if (group, option) == ("data", "chat"):  # ChatML's markers must be special tokens (validate says so)
        extra = ['tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]']
    if (group, option) == ("data", "preference"):  # pairs train a preference objective
        extra = ['tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]', "finetune.objective=dpo"]
    p = plan([f"{group}={option}", *extra], tmp_path)
    what, expected = OPTION_SHOWS[(group, option)]
    assert what(p, tmp_path) == expected, f"{group}={option}: {what.__doc__}"


def resolved(run_dir):
    import yaml

    return yaml.safe_load((run_dir / "config_resolved.yaml").read_text())


def strategy(p, _):
    """the strategy, its ZeRO stage and offload, as the plan resolved them"""
    ds = p["deepspeed"] or {}
    zero = ds.get("zero_optimization", {})
    return p["parallel"]["strategy"], zero.get("stage"), "offload_optimizer" in zero, "offload_param" in zero


# What each option changes in the plan (or in the resolved config, for the loggers): an option
# that stopped being applied fails here.
OPTION_SHOWS = {
    ("tokenizer", "bundled"): (lambda p, _: p["vocab"]["true"], 4096),
    ("tokenizer", "hf"): (lambda p, _: p["vocab"]["true"], 4096),
    ("tokenizer", "llama2"): (lambda p, _: (p["vocab"]["true"], p["tokenizer"]["add_bos"]), (32000, True)),
    ("data", "pydoc"): (lambda p, _: (p["batch"]["seq_len"], p["data_mixture"], p["preference"]), (128, None, None)),
    ("data", "text"): (lambda p, r: resolved(r)["data"]["path"].endswith("tinyshakespeare.txt"), True),
    ("data", "jsonl"): (lambda p, r: resolved(r)["data"]["source"], "jsonl"),
    ("data", "alpaca"): (lambda p, r: resolved(r)["data"]["format"], "instruction"),
    ("data", "chat"): (lambda p, r: resolved(r)["data"]["format"], "chat"),
    ("data", "preference"): (lambda p, _: p["preference"]["name"], "dpo"),
    ("data", "mixture"): (lambda p, _: [s["name"] for s in p["data_mixture"]["sources"]], ["tinyshakespeare", "alpaca_instructions"]),
    ("precision", "auto"): (lambda p, _: p["precision"]["value"], "32-true"),
    ("precision", "bf16"): (lambda p, _: p["precision"]["value"], "bf16-mixed"),
    ("precision", "fp16"): (lambda p, _: (p["precision"]["value"], p["precision"]["loss_scale"] is not None), ("16-mixed", True)),
    ("precision", "fp32"): (lambda p, _: p["precision"]["value"], "32-true"),
    ("parallel", "single"): (strategy, ("single", None, False, False)),
    ("parallel", "ddp"): (strategy, ("ddp", None, False, False)),
    ("parallel", "fsdp_tp"): (strategy, ("fsdp_tp", None, False, False)),
    ("parallel", "zero1"): (strategy, ("deepspeed", 1, False, False)),
    ("parallel", "zero2"): (strategy, ("deepspeed", 2, False, False)),
    ("parallel", "zero2_offload"): (strategy, ("deepspeed", 2, True, False)),
    ("parallel", "zero3"): (strategy, ("deepspeed", 3, False, False)),
    ("parallel", "zero3_offload"): (strategy, ("deepspeed", 3, True, True)),
    ("trainer", "default"): (lambda p, _: (p["max_steps"], p["schedule"]["kind"], p["optimizer"]["name"]), (250, "cosine", "adamw")),
    ("logger", "csv"): (lambda p, r: resolved(r)["logger"]["name"], "csv"),
    ("logger", "wandb"): (lambda p, r: resolved(r)["logger"]["name"], "wandb"),
    ("logger", "tensorboard"): (lambda p, r: resolved(r)["logger"]["name"], "tensorboard"),
    ("cluster", "local"): (lambda p, _: (p["cluster"]["name"], p["world_size"]), ("local", 1)),
    ("cluster", "slurm"): (lambda p, _: (p["cluster"]["name"], p["world_size"]), ("slurm", 8)),
}


def test_every_group_option_says_what_it_changes():
    shipped = {(g, o) for g in ("tokenizer", "data", "precision", "parallel", "trainer", "logger", "cluster") for o in options(g)}
    assert shipped == set(OPTION_SHOWS)


@pytest.mark.parametrize("experiment", options("experiment"))
def test_experiment_presets_plan(experiment, tmp_path):
    if experiment == "tinyllama_pretrain" and not LLAMA2_TOKENIZER.exists():
        pytest.skip("../shared/data absent")
    gpus = ["cluster.devices=8"] if experiment == "long_context" else []  # the recipe's 8B model at 32k is sized for a node
    p = plan([f"experiment={experiment}", "hardware.gpu=A800", *gpus], tmp_path)
    assert p["precision"]["value"] == "bf16-mixed"
    if experiment == "tinyllama_pretrain":
        assert p["vocab"]["true"] == 32000 and p["batch"]["seq_len"] == 2048
        # TinyLlama's 1024 sequences per step (docs/slurm.md): micro 8 x accumulation 128 on one GPU.
        assert (p["batch"]["global_batch_size"], p["batch"]["accumulate_grad_batches"]) == (1024, 128)


@pytest.mark.parametrize("launcher", options("hydra/launcher"))
def test_launcher_presets_render_sbatch_options(launcher, tmp_path):
    """Each submitit preset composes, instantiates Hydra's SlurmLauncher, and renders the sbatch
    header submitit would submit: one task per GPU, the signal before the time limit."""
    import submitit
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.utils import instantiate
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf
    from submitit.slurm.slurm import _make_sbatch_string

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra_compose(config_name="config", overrides=[f"hydra/launcher={launcher}", "hydra.launcher.partition=gpu"], return_hydra_config=True)
    params = dict(instantiate(cfg.hydra.launcher, submitit_folder=str(tmp_path), name="grid").params)
    assert params["tasks_per_node"] == params["gpus_per_node"]
    # The launcher's own translation to submitit's parameters (BaseSubmititLauncher.launch).
    executor = submitit.AutoExecutor(cluster="slurm", folder=tmp_path, slurm_max_num_timeout=params.pop("max_num_timeout"))
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    executor.update_parameters(**{k if k in base else f"slurm_{k}": v for k, v in params.items() if k != "submitit_folder"})
    header = _make_sbatch_string(command="true", folder=tmp_path, **executor._executor.parameters)
    for line in ("--gpus-per-node=8", "--ntasks-per-node=8", "--partition=gpu", "--signal=USR2@300"):
        assert f"#SBATCH {line}\n" in header

"""Preference tuning end to end on a tiny 'pretrained' Llama and synthetic pairs whose preferred
answer is learnable (chosen answers use one set of words, rejected ones another):

- single, full fine-tuning (a frozen reference copy): step 0 is exact (DPO loss ln 2, every reward
  0), reward accuracy rises above 0.9 with a growing margin, a run resumed mid-way logs what the
  uninterrupted one did and ends with its weights, and the export serves like any fine-tune;
- precompute_reference: the cached reference log-probs equal the online ones within 1e-5 (relative), and a
  second run with another beta reuses them (no reference forward);
- LoRA under ZeRO-2 (the reference is the base with the adapters off; adapters only, so one
  optimizer group) and SimPO, single;
- ddp, ZeRO-2 and ZeRO-3 (DeepSpeed's CPU accelerator) and fsdp_tp (tp 2) over gloo, full
  fine-tuning with the reference held like the policy: step 0 exact, the loss falls.
"""

import json
import math
import random

import numpy as np
import pytest
import torch

from tests.conftest import DEEPSPEED_ON_CPU, compose, metrics_rows, run_cli

pytestmark = pytest.mark.slow

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
GOOD, BAD = ["blue", "green", "calm", "kind", "bright"], ["red", "grey", "loud", "rude", "dull"]
METRICS = ("loss", "grad_norm", "rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen", "logps/rejected")
STRATEGIES = {
    "ddp": ["parallel=ddp", "cluster.devices=2"],
    "zero2": ["parallel=zero2", *DEEPSPEED_ON_CPU],
    "zero3": ["parallel=zero3", *DEEPSPEED_ON_CPU],
    "fsdp_tp": ["parallel=fsdp_tp", "parallel.tp=2", "cluster.devices=2"],
}
# How each holds the frozen reference (logged when it is placed).
HELD = {
    "ddp": "reference: a frozen copy on cpu",
    "zero2": "reference: a frozen copy in a DeepSpeed engine of its own, ZeRO stage 0",
    "zero3": "reference: a frozen copy in a DeepSpeed engine of its own, ZeRO stage 3",
    "fsdp_tp": "reference: a frozen copy sharded like the policy (FSDP2 x TP over {'data_parallel': 1, 'tensor_parallel': 2})",
}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    """A tiny 'pretrained' folder (the bundled tokenizer's 4096 rows) and 64 synthetic pairs."""
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import build_model, hf_config
    from tinytrain.plan.attention import AttentionChoice

    folder = tmp_path_factory.mktemp("preference")
    cfg = compose(MODEL)
    tok = load_from_config(cfg.tokenizer)
    torch.manual_seed(0)
    build_model(cfg.model, hf_config(cfg.model, len(tok), tok), AttentionChoice("sdpa", "test")).save_pretrained(folder / "base")
    rng = random.Random(0)
    rows = [{"prompt": f"Describe item {i}.", "chosen": f"It is {rng.choice(GOOD)}.", "rejected": f"It is {rng.choice(BAD)}."} for i in range(64)]
    (folder / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def args(assets, *extra) -> list[str]:
    return [
        "experiment=smoke",
        *MODEL,
        f"model.pretrained={assets / 'base'}",
        "data=jsonl",
        "data.format=preference",
        f"data.path={assets / 'pairs.jsonl'}",
        "data.chat_template=chatml",
        'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]',
        "finetune.trainable_tokens=none",
        "data.seq_len=32",
        f"data.cache_dir={assets / 'cache'}",
        "finetune.objective=dpo",
        "trainer.warmup_steps=1",
        "trainer.lr=5e-3",
        "trainer.log_every_n_steps=1",
        "trainer.progress_bar=false",
        "trainer.plot=false",
        "generate.sample_prompts=[]",
        "export.dtype=fp32",
        *extra,
    ]


def train(assets, run_dir, *extra):
    r = run_cli(args(assets, *extra), run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


def steps(run_dir) -> dict[int, dict]:
    return {int(r["step"]): {k: float(r[k]) for k in METRICS if r.get(k)} for r in metrics_rows(run_dir) if r.get("loss")}


def assert_exact_start(row: dict, loss: float = math.log(2)) -> None:
    assert row["loss"] == pytest.approx(loss, abs=1e-6), row
    for k in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        assert abs(row[k]) < 1e-6, (k, row)


@pytest.fixture(scope="module")
def single_run(assets, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("single") / "run"
    train(assets, run_dir, "trainer.max_steps=8", "trainer.checkpoint_every_n_steps=4", "trainer.val_every_n_steps=4")
    return run_dir


@pytest.mark.timeout(600)
def test_dpo_learns_the_preferred_answer_resumes_and_exports(assets, single_run, tmp_path):
    rows = steps(single_run)
    assert_exact_start(rows[0])
    assert rows[7]["rewards/accuracies"] > 0.9 and rows[6]["rewards/accuracies"] > 0.9
    margins = [rows[s]["rewards/margins"] for s in range(8)]
    assert np.mean(margins[5:]) > np.mean(margins[1:4]) > 0, margins
    assert rows[7]["loss"] < 0.75 * math.log(2)

    resumed = tmp_path / "resumed"
    train(assets, resumed, "trainer.max_steps=8", "trainer.checkpoint_every_n_steps=4", "trainer.val_every_n_steps=4", f"resume={single_run / 'checkpoints' / 'step0000004.ckpt'}", "trainer.export=false")
    assert {s: r for s, r in steps(resumed).items() if s >= 4} == {s: r for s, r in rows.items() if s >= 4}
    final = [torch.load(d / "checkpoints" / "final.ckpt", map_location="cpu", weights_only=False)["state_dict"] for d in (single_run, resumed)]
    assert final[0].keys() == final[1].keys() and not any("reference" in k for k in final[0])  # the frozen copy is never saved
    assert all(torch.equal(final[0][k], final[1][k]) for k in final[0])

    from tests.integration.export_checks import assert_export_matches

    weights = {k.removeprefix("model."): v for k, v in final[0].items()}
    assert_export_matches(single_run / "hf_export", weights, ["experiment=smoke", *MODEL, 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]'], 4098)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("Describe item 3.\n")
    r = run_cli(["mode=generate", f"checkpoint={single_run / 'hf_export'}", f"generate.prompts_file={prompts}", "generate.max_new_tokens=4"], tmp_path / "served")
    assert r.returncode == 0, r.stderr[-3000:]
    (row,) = [json.loads(line) for line in (single_run / "generations-hf_export.jsonl").read_text().splitlines()]
    assert row["chat"] and row["tokens"] > 0


@pytest.mark.timeout(600)
def test_precomputed_reference_equals_online_and_is_reused(assets, single_run, tmp_path):
    from tinytrain.data.datamodule import DataModule
    from tinytrain.data.tokenizer import load_from_config

    first = train(assets, tmp_path / "precomputed", "trainer.max_steps=2", "finetune.precompute_reference=true")
    assert "reference log-probs of 61 train + 3 validation pairs computed" in first.stdout
    (cache,) = (assets / "cache" / "reference_logps").glob("*.npz")
    # Online: the frozen reference copy a run without precompute builds scores the same pairs.
    from tinytrain.cli import run_stages
    from tinytrain.data.bos_policy import with_bos
    from tinytrain.train.fit import build_module

    cfg = compose(args(assets))
    plan = run_stages(compose(["mode=plan", *args(assets)]), tmp_path / "plan")
    tok = load_from_config(cfg.tokenizer)
    module = build_module(cfg, plan, tok)
    data = DataModule(with_bos(cfg.data, plan.bos.add), tok, micro_batch_size=4, seed=cfg.seed, progress=False)
    with np.load(cache) as f:
        cached = f["train"]
    for start in range(0, 12, 4):
        batch = data.collate([data.train[i] for i in range(start, start + 4)])
        online = module.reference_logps(batch)
        # Within 1e-5 of their size: float32 sums of ~50 log-probs, from forwards computed in another process.
        assert np.allclose(cached[start : start + 4].T.reshape(-1), online.numpy(), rtol=1e-5, atol=0)
    # The step-0 metrics of the precomputed run are the online run's (the same first batch).
    assert steps(tmp_path / "precomputed")[0] == pytest.approx(steps(single_run)[0], rel=1e-5, abs=1e-6)

    mtime = cache.stat().st_mtime_ns
    again = train(assets, tmp_path / "beta", "trainer.max_steps=2", "finetune.precompute_reference=true", "finetune.beta=0.3")
    assert "reused from" in again.stdout + again.stderr and "computed in" not in again.stdout
    assert cache.stat().st_mtime_ns == mtime and len(list(cache.parent.glob("*.npz"))) == 1
    assert_exact_start(steps(tmp_path / "beta")[0])


@pytest.mark.timeout(600)
@pytest.mark.parametrize("extra, start_loss", [(["finetune=lora", "finetune.rank=8", *STRATEGIES["zero2"]], math.log(2)), (["finetune.objective=simpo"], None)])
def test_lora_and_simpo(assets, tmp_path, extra, start_loss):
    r = train(assets, tmp_path / "run", "trainer.max_steps=4", *extra)
    rows = steps(tmp_path / "run")
    if start_loss is not None:  # LoRA: the base with adapters off is the policy at step 0
        assert "reference: the base with the adapters disabled" in r.stdout
        assert_exact_start(rows[0], start_loss)
    else:  # reference-free: rewards are beta x the mean answer log-prob
        assert "reference: none (reference-free)" in r.stdout
        assert rows[0]["rewards/chosen"] == pytest.approx(0.1 * rows[0]["logps/chosen"], rel=1e-5)
    assert rows[3]["loss"] < rows[0]["loss"]
    assert rows[3]["rewards/margins"] > rows[0]["rewards/margins"]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("strategy", list(STRATEGIES))
def test_every_strategy_starts_exactly_and_learns(assets, tmp_path, strategy):
    r = train(assets, tmp_path / "run", "trainer.max_steps=3", "trainer.val_every_n_steps=3", "trainer.checkpoint_every_n_steps=3", "trainer.export=false", *STRATEGIES[strategy])
    assert "reference: a frozen copy of the initial weights, held like the policy" in r.stdout
    assert HELD[strategy] in r.stdout + r.stderr
    rows = steps(tmp_path / "run")
    assert_exact_start(rows[0])
    assert rows[2]["loss"] < rows[0]["loss"] and rows[2]["rewards/margins"] > 0


@pytest.mark.timeout(600)
def test_a_step_s_metrics_are_the_mean_of_its_micro_batches(assets, tmp_path):
    """Under accumulation the metrics were the step's last micro batch's (-136.25 for a step's
    logps/chosen of -143.01): 4 pairs as 2 micro batches of 2 log what one micro batch of 4 does."""
    flat = ["trainer.max_steps=1", "trainer.warmup_steps=0", "data.group_by_length=false", "trainer.val_batches=0", "trainer.export=false"]
    train(assets, tmp_path / "one", *flat)
    train(assets, tmp_path / "two", *flat, "trainer.micro_batch_size=2", "trainer.accumulate_grad_batches=2")
    one, two = steps(tmp_path / "one")[0], steps(tmp_path / "two")[0]
    assert set(one) == set(two) and two == pytest.approx(one, rel=1e-5, abs=1e-6), (one, two)

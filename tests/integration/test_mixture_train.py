"""Weighted mixtures end to end through `python -m tinytrain`: a run resumed from a step checkpoint
trains exactly the batches (and losses) of the uninterrupted run, per source, while the small source
is repeated and across a (nominal) epoch; data.exhaustion=stop ends the run cleanly at the step its small source runs out."""

import json
import re
from collections import Counter

import pytest
import torch

from tests.conftest import compose, logged, metrics_rows, run_cli

pytestmark = pytest.mark.slow

MODEL = ["model.num_layers=2", "model.hidden_size=32", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=64"]
RUN = ["experiment=smoke", *MODEL, "data=mixture", "data.seq_len=16", "data.tokenize_workers=0", "trainer.log_every_n_steps=1", "trainer.progress_bar=false", "trainer.export=false", "trainer.plot=false"]


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """'big' (12 documents: 17 training windows of 16 tokens) and 'small' (6 documents: 3 windows),
    so a nominal epoch is 5 batches of 4 and the runs below cross epochs."""
    folder = tmp_path_factory.mktemp("mixture")
    (folder / "big.txt").write_text("\n\n".join(f"The river number {i} runs down to the sea, and the sea is wide." for i in range(12)))
    (folder / "small.txt").write_text("\n\n".join(f"def f{i}(x): return x + {i}" for i in range(6)))
    return [f"data.cache_dir={folder / 'cache'}", f"data.sources=[{{path: {folder / 'big.txt'}, weight: 3}}, {{path: {folder / 'small.txt'}, weight: 1}}]"]


def data_position(checkpoint) -> dict:
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=False)
    return next(v for k, v in ckpt["callbacks"].items() if k.startswith("DataPosition"))


def batches(run_dir) -> list[str]:
    return (run_dir / "batches.txt").read_text().splitlines()


def test_a_resumed_mixture_trains_the_uninterrupted_runs_batches(tmp_path, sources):
    run = [*RUN, *sources, "trainer.max_steps=8", "trainer.checkpoint_every_n_steps=4"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    for run_dir in (whole, resumed):
        run_dir.mkdir()
    r = run_cli(run, whole, env={"TT_TEST_BATCH_LOG": str(whole / "batches.txt")}, module="tests.integration.instrumented_cli")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    position = data_position(whole / "checkpoints" / "step0000004.ckpt")
    small = position["sources"]["small"]
    assert position["samples"] == 4 * 4 and sum(s["position"] for s in position["sources"].values()) == 16
    assert small["items"] == 3 and small["pass"] >= 1  # the small source is already being repeated
    assert position["sources"]["big"]["items"] == 17 and position["epoch"] == 0  # the resumed run crosses into epoch 1
    r = run_cli([*run, f"resume={whole / 'checkpoints' / 'step0000004.ckpt'}"], resumed, env={"TT_TEST_BATCH_LOG": str(resumed / "batches.txt")}, module="tests.integration.instrumented_cli")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert batches(resumed) == batches(whole)[4:]  # steps 5-8: the same samples, in the same order
    compared = ("loss", "lr", "grad_norm", "val_loss")
    rows = lambda d: [(r["step"], {k: r[k] for k in compared if r.get(k)}) for r in metrics_rows(d)]  # noqa: E731
    assert rows(resumed)[-4:] == rows(whole)[-4:]
    assert data_position(resumed / "checkpoints" / "final.ckpt")["sources"] == data_position(whole / "checkpoints" / "final.ckpt")["sources"]


def test_data_stages_switch_sources_at_their_step_and_resume_exactly_across_the_boundary(tmp_path, sources):
    """data.stages through the CLI: steps 1-5 draw only 'big', steps 6-8 only 'small' (the plan's
    table says so); a run resumed from step 4 crosses the boundary with the uninterrupted run's batches."""
    stages = "data.stages=[{until_step: 5, weights: {big: 1}}, {until_step: null, weights: {small: 1}}]"
    run = [*RUN, *sources, stages, "trainer.max_steps=8", "trainer.checkpoint_every_n_steps=4"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    for run_dir in (whole, resumed):
        run_dir.mkdir()
    r = run_cli(run, whole, env={"TT_TEST_BATCH_LOG": str(whole / "batches.txt")}, module="tests.integration.instrumented_cli")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert re.search(r"data\.stages\[0\]\s+0-5\s+100\.0%\s+0\.0%", out) and re.search(r"data\.stages\[1\]\s+5-8\s+0\.0%\s+100\.0%", out), out[-3000:]
    position = data_position(whole / "checkpoints" / "final.ckpt")
    assert position["sources"]["big"]["position"] == 5 * 4 and position["sources"]["small"]["position"] == 3 * 4
    r = run_cli([*run, f"resume={whole / 'checkpoints' / 'step0000004.ckpt'}"], resumed, env={"TT_TEST_BATCH_LOG": str(resumed / "batches.txt")}, module="tests.integration.instrumented_cli")
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    assert batches(resumed) == batches(whole)[4:]
    assert data_position(resumed / "checkpoints" / "final.ckpt")["sources"] == position["sources"]


def test_exhaustion_stop_ends_the_run_at_the_step_a_source_runs_out(tmp_path, sources):
    run_dir = tmp_path / "run"
    r = run_cli([*RUN, *sources, "trainer.max_steps=12", "data.exhaustion=stop"], run_dir)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    stopped = re.search(r"data: mixture source 'small' \(data\.sources\[1\]\.path\) ran out at step (\d+): (\d) of its 3 items drawn, and step \d+ would draw more than are left", out)
    assert stopped, out[-3000:]
    step = int(stopped.group(1))
    assert 1 <= step < 12
    assert "the run stops near step" in out  # the plan expected it
    position = data_position(run_dir / "checkpoints" / f"step{step:07d}.ckpt")
    assert position["samples"] == step * 4 and position["sources"]["small"]["position"] == int(stopped.group(2))
    assert (run_dir / "checkpoints" / "final.ckpt").exists()
    assert max(int(r["step"]) for r in metrics_rows(run_dir)) <= step


def test_an_sft_mixture_is_tokenized_once_for_its_plan_and_its_training(tmp_path, monkeypatch):
    """The plan's mixture table is read from the data training uses: each source's records are
    tokenized once per run (the plan and fit once built a DataModule each)."""
    import tinytrain.data.datamodule as datamodule
    from tinytrain.cli import run_stages

    for name, word in (("maths", "add"), ("poems", "rhyme")):
        records = [{"instruction": f"{word} {i}", "input": "", "output": f"{word} done {i}"} for i in range(12)]
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    tokenized = Counter()
    build_samples = datamodule.build_samples

    def counting(records, data_cfg, tokenizer, bad):
        tokenized[bad.key] += 1
        return build_samples(records, data_cfg, tokenizer, bad)

    monkeypatch.setattr(datamodule, "build_samples", counting)
    sources = f"data.sources=[{{path: {tmp_path / 'maths.jsonl'}, weight: 1}}, {{path: {tmp_path / 'poems.jsonl'}, weight: 1}}]"
    cfg = compose([*RUN, sources, "data.source=jsonl", "data.format=instruction", "data.chat_template=alpaca", "data.seq_len=64", "trainer.max_steps=2", "trainer.warmup_steps=1", "generate.sample_prompts=[]"])
    result = run_stages(cfg, tmp_path / "run")
    assert tokenized == {"data.sources[0].path": 1, "data.sources[1].path": 1}
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert [(s["name"], s["items"]) for s in plan["data_mixture"]["sources"]] == [("maths", 11), ("poems", 11)]
    assert len(logged(tmp_path / "run", "loss")) == 2 and result["last_loss"] > 0

"""End to end through `python -m tinytrain`: prepare a token store, train on it, and train on SFT
data (packed chat, padded instructions)."""

import re

import pytest
import torch

from tests.conftest import SHARED_DATA, logged, run_cli

pytestmark = pytest.mark.slow

SMOKE = ["experiment=smoke", "trainer.progress_bar=false", "trainer.export=false", "trainer.plot=false"]
CHAT_TOKENS = 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]'


def test_prepare_then_train_on_the_packed_store(tmp_path):
    cache = tmp_path / "cache"
    prepared = run_cli(["mode=prepare", f"data.cache_dir={cache}", "data.tokenize_workers=2", "data.seq_len=64"], tmp_path / "prepare")
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    store = re.search(r"token store (\S+) \(built in [\d.]+ s with 2 workers\)", prepared.stdout)
    assert store, prepared.stdout[-2000:]
    run_dir = tmp_path / "run"
    unused = tmp_path / "never" / "used"
    r = run_cli([*SMOKE, f"data.store={store.group(1)}", f"data.cache_dir={unused}"], run_dir)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert not unused.exists()  # a named store carries its own sample index
    assert "(data.store)" in out and "documents isolated" in out
    assert len(logged(run_dir, "loss")) > 0
    ckpt = torch.load(run_dir / "checkpoints" / "step0000008.ckpt", map_location="cpu", weights_only=False)
    position = next(v for k, v in ckpt["callbacks"].items() if k.startswith("DataPosition"))
    assert position["consumed_batches"] == 8 and position["batch_size"] == 4  # smoke: 8 steps of micro batch 4


def test_packed_chat_sft_trains(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli([*SMOKE, "data=chat", "data.pack=true", CHAT_TOKENS], run_dir)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "packed into" in out and "template chatml" in out
    assert all(loss == loss for loss in logged(run_dir, "loss"))  # finite


@pytest.mark.skipif(not (SHARED_DATA / "alpaca_seed_tasks.jsonl").exists(), reason="../shared/data/alpaca_seed_tasks.jsonl absent")
def test_alpaca_instruction_sft_trains(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli([*SMOKE, "data=alpaca", "data.seq_len=128"], run_dir)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert re.search(r"175 records -> \d+ samples", out) and "padded to the longest" in out
    assert len(logged(run_dir, "loss")) > 0

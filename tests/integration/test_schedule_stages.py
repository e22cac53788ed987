"""Warmup-stable-decay and stages through `python -m tinytrain`: a decay branched off a stable-phase
checkpoint of a WSD run (a new trainer.stage in its own directory, resume=<that checkpoint>) trains
step for step what a run given the combined schedule from the start trains: loss, lr and grad_norm
to the bit, the rate of its first step included (the checkpoint's optimizer holds the old
schedule's). metrics.csv says which stage trained each step."""

import pytest

from tests.conftest import metrics_rows, run_cli

pytestmark = pytest.mark.slow

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
RUN = ["experiment=smoke", *MODEL, "data.seq_len=32", "trainer.log_every_n_steps=1", "trainer.val_batches=0", "trainer.progress_bar=false", "trainer.export=false", "trainer.plot=false", "trainer.lr_schedule=wsd"]
# The combined schedule: warm-up steps 0-1, stable 2-3, decay 4-8 (its last trained step at the minimum).
# Step 4, the branch's first, is the decay's first: every step before it is stable in both runs.
COMBINED = ["trainer.max_steps=9", "trainer.decay_steps=5"]
COMPARED = ("loss", "lr", "grad_norm")


def rows(run_dir) -> list[tuple]:
    return [(r["step"], r["stage"], *(r[k] for k in COMPARED)) for r in metrics_rows(run_dir) if r.get("loss")]


def test_a_decay_branched_from_a_stable_checkpoint_equals_the_combined_schedule(tmp_path):
    combined, main, anneal = tmp_path / "combined", tmp_path / "main", tmp_path / "anneal"
    r = run_cli([*RUN, *COMBINED], combined)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    # The main run: stable to step 4, its one decay step 5 (its checkpoint at step 4 is mid-stable).
    r = run_cli([*RUN, "trainer.max_steps=6", "trainer.decay_steps=1"], main)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    branch = main / "checkpoints" / "step0000004.ckpt"
    r = run_cli([*RUN, *COMBINED, f"resume={branch}", "trainer.stage=anneal"], anneal)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-3000:]
    assert "stage      'anneal' from step 4 (stage 'main''s checkpoint)" in out
    whole, branched = rows(combined), rows(anneal)
    assert [s[0] for s in branched] == ["4", "5", "6", "7", "8"]
    assert {s[1] for s in branched} == {"anneal"} and {s[1] for s in whole} == {"main"}
    assert [s[2:] for s in branched] == [s[2:] for s in whole[4:]]
    assert rows(main)[:4] == whole[:4]  # the same run up to the branch
    assert float(branched[0][3]) < float(rows(main)[4][3])  # step 4 decays in the branch, is stable in main

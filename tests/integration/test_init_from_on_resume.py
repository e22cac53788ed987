"""A resume continues from the run's own checkpoint: checkpoint.init_from, since pruned or moved (a
requeued fine-tune whose base run kept only its newest checkpoints), was refused as missing, and
the requeue failed. It is not read then, except where the resumed run rebuilds weights from it."""

import shutil
from types import SimpleNamespace

import pytest

from tests.conftest import run_cli
from tinytrain.errors import ConfigError
from tinytrain.plan.planner import init_from_needed

TINY = ["experiment=smoke", "trainer.warmup_steps=1", "trainer.checkpoint_every_n_steps=2", "trainer.progress_bar=false", "trainer.export=false", "trainer.plot=false"]


def test_a_resume_does_not_need_the_checkpoint_the_run_started_from(tmp_path):
    base = tmp_path / "base"
    r = run_cli([*TINY, "trainer.max_steps=2"], base)
    assert r.returncode == 0, r.stderr[-2000:]
    start = tmp_path / "start.ckpt"
    shutil.copy(base / "checkpoints" / "final.ckpt", start)
    run = tmp_path / "run"
    r = run_cli([*TINY, "trainer.max_steps=2", f"checkpoint.init_from={start}"], run)
    assert r.returncode == 0, r.stderr[-2000:]
    start.unlink()  # pruned by its run, or moved
    r = run_cli([*TINY, "trainer.max_steps=4", f"checkpoint.init_from={start}"], run)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "not applied: the run continues from its own checkpoint" in r.stdout + r.stderr
    r = run_cli([*TINY, "trainer.max_steps=4", f"checkpoint.init_from={start}"], tmp_path / "fresh")  # nothing to resume: it is read
    assert r.returncode == 2 and "no such checkpoint file" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize(
    ("adapters", "preference", "words"),
    [
        (object(), None, "the frozen base of its adapters"),
        (None, SimpleNamespace(frozen_copy=True, precomputed=False), "its frozen reference model"),
        (None, SimpleNamespace(frozen_copy=False, precomputed=True), "reference log-probs"),
    ],
)
def test_a_resume_that_rebuilds_weights_from_it_names_it(adapters, preference, words):
    cfg = SimpleNamespace(checkpoint=SimpleNamespace(init_from="runs/base/checkpoints/step0000100.ckpt"))
    with pytest.raises(ConfigError) as e:
        init_from_needed(cfg, SimpleNamespace(step=40), SimpleNamespace(adapters=adapters, preference=preference))
    assert "resumes from step 40" in str(e.value) and words in str(e.value)
    init_from_needed(cfg, SimpleNamespace(step=40), SimpleNamespace(adapters=None, preference=None))  # full weights: not read

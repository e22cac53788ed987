"""What a run appends as it goes, after a kill and a resume from an earlier checkpoint: the steps
after that checkpoint are trained again and write their records again. metrics.csv and evals.csv
dropped the first writing; samples.jsonl, grad_spikes.jsonl and TensorBoard's events kept both."""

import json
from collections import Counter

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.slow

MODEL = ["model.num_layers=1", "model.hidden_size=32", "model.num_heads=2", "model.num_kv_heads=1", "model.intermediate_size=64", "data.seq_len=32"]
RUN = ["experiment=smoke", *MODEL, "trainer.max_steps=6", "trainer.warmup_steps=1", "trainer.val_every_n_steps=2", "trainer.checkpoint_every_n_steps=2", "trainer.log_every_n_steps=1",
       "generate.sample_max_new_tokens=2", "guard.grad_spike_factor=1.0001", "guard.grad_spike_warmup=0", "logger=tensorboard", "trainer.export=false", "trainer.plot=false", "trainer.progress_bar=false"]


def steps(path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_a_resume_from_an_earlier_checkpoint_keeps_one_record_of_each_step(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir = tmp_path / "run"
    r = run_cli(RUN, run_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    first_samples, first_spikes = steps(run_dir / "samples.jsonl"), steps(run_dir / "grad_spikes.jsonl")
    assert first_samples and first_spikes
    # As if killed after step 6 before its checkpoints were in place: the resume starts at step 4.
    for name in ("step0000006.ckpt", "final.ckpt"):
        (run_dir / "checkpoints" / name).unlink()
    r = run_cli(RUN, run_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resuming from checkpoints/step0000004.ckpt" in r.stdout + r.stderr
    assert steps(run_dir / "samples.jsonl") == first_samples  # steps 5-6's again, once
    assert sorted(steps(run_dir / "grad_spikes.jsonl")) == sorted(first_spikes)  # the running average resumed too
    acc = EventAccumulator(str(run_dir / "tensorboard"))
    acc.Reload()
    for tag in ("loss", "val_loss"):
        logged = Counter(e.step for e in acc.Scalars(tag))
        assert set(logged.values()) == {1}, (tag, logged)

"""trainer.profile's callback (train/callbacks/profiler.py): the window of steps it traces, the top
costs it names, and on a CUDA out-of-memory error the allocator's snapshot beside the plan's
estimate (the CUDA calls stood in for: no GPU here)."""

import json
from types import SimpleNamespace

import pytest
import torch

from tinytrain.train.callbacks.profiler import Profiler

ESTIMATE = {"total_gib": 71.5, "activations_gib": 40.0}


def test_traces_the_window_and_names_the_top_costs(tmp_path):
    callback = Profiler(tmp_path / "profile", start=2, steps=2, memory_estimate=ESTIMATE)
    trainer = SimpleNamespace(global_rank=0, global_step=0)
    callback.on_train_start(trainer, None)
    a = torch.randn(64, 64)
    for step in range(1, 6):
        for _ in range(2):  # two micro batches a step: the profiler steps once per optimizer step
            a = (a @ a).tanh()
            callback.on_train_batch_end(trainer, None, None, None, 0)
        trainer.global_step = step
        callback.on_train_batch_end(trainer, None, None, None, 0)
    callback.on_train_end(trainer, None)
    traces = list((tmp_path / "profile").glob("rank0.*.pt.trace.json"))
    assert len(traces) == 1 and json.loads(traces[0].read_text())["traceEvents"]
    assert "aten::mm" in (tmp_path / "profile" / "top_ops_rank0.txt").read_text()
    assert "profile of steps 2-3" in callback.summary() and "aten::mm" in callback.summary()
    # The steps the throughput summary leaves out: the warm-up step, the window, the step whose
    # measured time holds the trace's writing.
    assert [step for step in range(7) if callback.traces(step)] == [1, 2, 3, 4]


def test_out_of_memory_leaves_a_snapshot_beside_the_estimate(tmp_path, monkeypatch):
    dumped = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", lambda path: dumped.append(path))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 80 * 2**30)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda: 81 * 2**30)
    callback = Profiler(tmp_path / "profile", start=3, steps=3, memory_estimate=ESTIMATE)
    callback.on_exception(None, None, RuntimeError("not memory"))
    assert not dumped
    callback.on_exception(None, None, torch.OutOfMemoryError("CUDA out of memory"))
    assert dumped == [str(tmp_path / "profile" / "memory_snapshot_rank0.pickle")]
    beside = json.loads((tmp_path / "profile" / "memory_estimate_rank0.json").read_text())
    assert beside == {"plan": ESTIMATE, "measured": {"max_allocated_gib": 80.0, "reserved_gib": 81.0}}


def test_the_plan_says_which_steps_are_traced(tmp_path):
    from tests.conftest import plan
    from tinytrain.plan.run_plan import render

    planned = plan(["trainer.profile=true", "trainer.profile_start=4", "trainer.profile_steps=2", "trainer.max_steps=10", "trainer.warmup_steps=2"], tmp_path)
    assert planned["profile"].startswith("steps 4-5 of this process traced, after a warm-up step (3) -> <run>/profile/")
    assert f"profile    {planned['profile']}" in render(planned).splitlines()
    assert plan([], tmp_path / "off")["profile"] is None


def test_a_resumed_run_s_window_is_checked_against_the_steps_left(tmp_path):
    """Resumed at step 4 of 8, a window of this process's steps 3-5 would end beyond the 4 steps
    left: only one step would be traced (validate checks the window against a fresh run's steps)."""
    import torch

    from tests.conftest import compose, plan
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.errors import ConfigError
    from tinytrain.model.build import build_model, model_config
    from tinytrain.plan.planner import make_plan

    run = ["trainer.max_steps=8", "trainer.warmup_steps=2", "trainer.profile=true", "trainer.profile_steps=3"]
    cfg = compose(run)
    tokenizer = load_from_config(cfg.tokenizer)
    planned = make_plan(cfg, tokenizer, tmp_path / "saved")
    model = build_model(cfg.model, model_config(cfg.model, planned.vocab.padded, tokenizer), planned.attention)
    checkpoint = tmp_path / "step0000004.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()}, "tinytrain": planned.checkpoint_metadata(), "global_step": 4}, checkpoint)
    with pytest.raises(ConfigError, match=r"trainer.profile_start=3: the profiled steps 3-5 of this process end beyond the 4 steps left \(resuming at step 4 of trainer.max_steps=8\). Fix: use trainer.profile_start <= 1"):
        plan([*run, f"resume={checkpoint}"], tmp_path / "resumed")
    assert plan([*run, f"resume={checkpoint}", "trainer.profile_start=1"], tmp_path / "fits")["profile"].startswith("steps 1-3")

"""A local multirun trains its jobs one after another in one process: each job's model, optimizer
state, data maps and watchdog must go with it. The collector's freeze at the next job's imports
moved the finished job's (cyclic) garbage out of its reach for good: +40 MB and +9 open files a job
on a tiny model, a watchdog zombie each, and on a GPU the job's memory."""

import gc
import weakref

import pytest

from tests.cli_in_process import run_in_process

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(("lrs", "exit_code"), [("1e-3,2e-3", 0), ("1e30,1e-3", 3)], ids=["finished", "failed"])
def test_a_finished_multirun_job_s_model_is_collected(tmp_path, monkeypatch, lrs, exit_code):
    """Also a job that failed (lr 1e30: its weights end non-finite, exit 3): Hydra keeps its
    exception for the sweep's end, and the traceback's frames held the job's model."""
    from tinytrain.model.module import CausalLMModule

    modules: list[weakref.ref] = []
    alive_at_next_job: list[bool] = []
    init = CausalLMModule.__init__

    def recorded(self, *args, **kwargs):
        if modules:  # the next job builds its model: the one before must be gone by now
            gc.collect()
            alive_at_next_job.append(modules[-1]() is not None)
        init(self, *args, **kwargs)
        modules.append(weakref.ref(self))

    monkeypatch.setattr(CausalLMModule, "__init__", recorded)
    model = ["model.num_layers=1", "model.hidden_size=32", "model.num_heads=2", "model.num_kv_heads=1", "model.intermediate_size=64", "data.seq_len=32"]
    args = ["-m", "experiment=smoke", *model, "trainer.max_steps=3", "trainer.warmup_steps=1", f"trainer.lr={lrs}", "trainer.export=false", "trainer.plot=false", "trainer.progress_bar=false", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    code, err = run_in_process(args)
    assert code == exit_code, err[-3000:]
    assert len(modules) == 2
    assert alive_at_next_job == [False]  # the first job's model, collected before the second built its own

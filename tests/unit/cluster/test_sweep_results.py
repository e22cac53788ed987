"""The multirun callback: result.json per job from Hydra's JobReturn, and the jobs listed best first."""

import json

from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from tinytrain.cluster.sweep_results import SweepResults
from tinytrain.errors import ConfigError, Problem


def job_config(sweep_dir, num, mode=RunMode.MULTIRUN):
    return OmegaConf.create({"hydra": {"mode": mode, "job": {"num": num}, "runtime": {"output_dir": str(sweep_dir / str(num))}, "sweep": {"dir": str(sweep_dir)}}})


def finished(overrides, status, value):
    ret = JobReturn(overrides=overrides, status=status)
    ret.return_value = value
    return ret


def test_jobs_are_recorded_and_listed_best_first(tmp_path, capsys):
    callback = SweepResults()
    bad_lr = ConfigError(Problem("trainer.lr", -1.0, "must be positive", "use e.g. trainer.lr=3e-4"))
    jobs = [
        (["trainer.lr=-1"], JobStatus.FAILED, bad_lr),
        (["trainer.lr=0.01"], JobStatus.COMPLETED, 4.25),
        (["trainer.lr=0.003"], JobStatus.COMPLETED, 3.5),
        (["trainer.lr=0.001", "mode=plan"], JobStatus.COMPLETED, None),  # no validation ran
    ]
    for num, (overrides, status, value) in enumerate(jobs):
        (tmp_path / str(num)).mkdir()
        callback.on_job_end(job_config(tmp_path, num), finished(overrides, status, value))

    failed = json.loads((tmp_path / "0" / "result.json").read_text())
    assert failed["status"] == "failed" and failed["val_loss"] is None
    assert "trainer.lr=-1.0: must be positive" in failed["error"]
    assert json.loads((tmp_path / "2" / "result.json").read_text())["val_loss"] == 3.5

    callback.on_multirun_end(job_config(tmp_path, 0))
    table = [line.split()[1] for line in capsys.readouterr().out.splitlines() if line.strip().startswith("job ")]
    assert table == ["2", "1", "0", "3"]


def test_single_runs_write_no_result_file(tmp_path):
    (tmp_path / "0").mkdir()
    SweepResults().on_job_end(job_config(tmp_path, 0, mode=RunMode.RUN), finished([], JobStatus.COMPLETED, 3.0))
    assert not (tmp_path / "0" / "result.json").exists()

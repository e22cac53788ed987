"""The multirun callback: result.json per job from Hydra's JobReturn, and the jobs listed best first."""

import json
from pathlib import Path

from hydra.core.utils import JobReturn, JobStatus
from hydra.types import RunMode
from omegaconf import OmegaConf

from tinytrain.cluster.sweep_results import DirectoryTaken, SweepResults, claim
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


def job_in(sweep_dir, num, overrides, subdir=None, mode="train"):
    config = job_config(sweep_dir, num)
    config.hydra.overrides = {"task": overrides}
    config.hydra.sweep.subdir = subdir or str(num)
    config.hydra.runtime.output_dir = str(sweep_dir / config.hydra.sweep.subdir)
    config.mode = mode
    Path(config.hydra.runtime.output_dir).mkdir(parents=True, exist_ok=True)
    return config


def trains(job_dir):
    """The job saved a checkpoint: what resume=auto would continue."""
    (job_dir / "checkpoints").mkdir(parents=True, exist_ok=True)
    (job_dir / "checkpoints" / "step0000004.ckpt").write_bytes(b"")


def claimed(callback, sweep_dir, num, overrides, subdir=None):
    """Job `num` starts and claims its directory (as hydra_main does, holding the run lock): the
    refusal's message, or None."""
    config = job_in(sweep_dir, num, overrides, subdir)
    callback.on_job_start(config)
    try:
        claim(Path(config.hydra.runtime.output_dir), overrides, config.hydra.sweep.subdir, sweep_dir)
    except DirectoryTaken as e:
        return str(e)
    return None


def test_jobs_of_one_multirun_sharing_a_directory_are_refused_keeping_the_first_s_record(tmp_path):
    """Job 1 resumed job 0's run and reported its loss as its own."""
    callback = SweepResults()
    callback.on_multirun_start(job_config(tmp_path, 0))
    assert claimed(callback, tmp_path, 0, ["trainer.lr=0.001"], subdir="same") is None
    trains(tmp_path / "same")
    callback.on_job_end(job_in(tmp_path, 0, ["trainer.lr=0.001"], "same"), finished(["trainer.lr=0.001"], JobStatus.COMPLETED, 4.0))
    refusal = claimed(callback, tmp_path, 1, ["trainer.lr=0.003"], subdir="same")
    assert "hydra.sweep.subdir='same': puts jobs 0 and 1 of this multirun in one directory" in refusal
    refused = finished(["trainer.lr=0.003"], JobStatus.FAILED, DirectoryTaken(Problem("hydra.sweep.subdir", "same", "x", "y")))
    callback.on_job_end(job_in(tmp_path, 1, ["trainer.lr=0.003"], "same"), refused)
    assert json.loads((tmp_path / "same" / "result.json").read_text())["val_loss"] == 4.0  # job 0's record kept


def test_an_earlier_multirun_s_job_is_continued_only_by_its_own_overrides(tmp_path):
    first = SweepResults()
    first.on_multirun_start(job_config(tmp_path, 0))
    assert claimed(first, tmp_path, 0, ["trainer.lr=0.001"]) is None
    assert json.loads((tmp_path / "0" / "result.json").read_text())["status"] == "running"  # killed here, say
    trains(tmp_path / "0")
    again = SweepResults()
    again.on_multirun_start(job_config(tmp_path, 0))
    assert "holds an earlier multirun" in claimed(again, tmp_path, 0, ["trainer.lr=0.005"])
    assert claimed(again, tmp_path, 0, ["trainer.lr=0.001"]) is None  # the same command again continues it
    assert claimed(again, tmp_path, 0, ["trainer.lr=0.001", "trainer.max_steps=8"]) is None  # extended


def test_a_record_of_an_older_tinytrain_is_an_earlier_multirun_s_job(tmp_path):
    """Records written before multirun ids carry no mode and no id: a new multirun under the same
    run.name took over those jobs' runs under its own learning rates, silently."""
    (tmp_path / "0").mkdir()
    trains(tmp_path / "0")
    old = {"job": 0, "overrides": ["trainer.lr=0.001"], "status": "completed", "val_loss": 6.9, "error": None}
    (tmp_path / "0" / "result.json").write_text(json.dumps(old))
    newer = SweepResults()
    newer.on_multirun_start(job_config(tmp_path, 0))
    assert "holds an earlier multirun" in claimed(newer, tmp_path, 0, ["trainer.lr=0.01"])
    assert claimed(newer, tmp_path, 0, ["trainer.lr=0.001"]) is None  # its own command continues it
    # Then every mode wrote result.json: an eval's over the training's record is no training job.
    (tmp_path / "0" / "result.json").write_text(json.dumps({**old, "overrides": ["mode=eval", "checkpoint=final", "trainer.lr=0.001"]}))
    assert claimed(newer, tmp_path, 0, ["trainer.lr=0.001"]) is None


def test_a_job_that_trained_nothing_leaves_its_directory_free_and_a_refused_one_its_record(tmp_path):
    """A job failed on a bad value (no checkpoint): the corrected multirun may use its directory.
    A job refused before its claim (the run lock, a bad key) wrote its failure over the record of
    the job running there, which the next multirun then took over."""
    first = SweepResults()
    first.on_multirun_start(job_config(tmp_path, 0))
    assert claimed(first, tmp_path, 0, ["trainer.lr=-1"]) is None  # fails in its plan: no checkpoint
    fixed = SweepResults()
    fixed.on_multirun_start(job_config(tmp_path, 0))
    assert claimed(fixed, tmp_path, 0, ["trainer.lr=0.001"]) is None
    trains(tmp_path / "0")
    second = SweepResults()
    second.on_multirun_start(job_config(tmp_path, 0))
    config = job_in(tmp_path, 0, ["trainer.lr=0.005"])
    second.on_job_start(config)  # then refused by the run lock, before its claim
    second.on_job_end(config, finished(["trainer.lr=0.005"], JobStatus.FAILED, ConfigError(Problem("hydra.run.dir", "x", "is in use", "wait"))))
    assert json.loads((tmp_path / "0" / "result.json").read_text())["overrides"] == ["trainer.lr=0.001"]


def test_an_eval_multirun_in_the_training_job_directories_keeps_their_records(tmp_path):
    """`-m mode=eval checkpoint=final` under the training multirun's run.name evaluates each job;
    the training multirun's command, run again, still continues its jobs."""
    train = SweepResults()
    train.on_multirun_start(job_config(tmp_path, 0))
    assert claimed(train, tmp_path, 0, ["trainer.lr=0.001"]) is None
    evals = SweepResults()
    evals.on_multirun_start(job_config(tmp_path, 0))
    config = job_in(tmp_path, 0, ["mode=eval", "checkpoint=final"], mode="eval")
    evals.on_job_start(config)
    evals.on_job_end(config, finished(["mode=eval", "checkpoint=final"], JobStatus.COMPLETED, 3.0))
    assert json.loads((tmp_path / "0" / "result-eval.json").read_text())["val_loss"] == 3.0
    assert json.loads((tmp_path / "0" / "result.json").read_text())["mode"] == "train"
    rerun = SweepResults()
    rerun.on_multirun_start(job_config(tmp_path, 0))
    assert claimed(rerun, tmp_path, 0, ["trainer.lr=0.001"]) is None


def test_the_list_holds_this_multirun_s_jobs_at_any_depth(tmp_path, capsys):
    old = SweepResults()
    old.on_multirun_start(job_config(tmp_path, 0))
    for num in (0, 1, 2):
        (tmp_path / str(num)).mkdir()
        old.on_job_end(job_config(tmp_path, num), finished([f"trainer.lr={num}"], JobStatus.COMPLETED, 1.0 + num))
    new = SweepResults()
    new.on_multirun_start(job_config(tmp_path, 0))
    nested = job_config(tmp_path, 0)
    nested.hydra.runtime.output_dir = str(tmp_path / "lr_5" / "0")
    Path(nested.hydra.runtime.output_dir).mkdir(parents=True)
    new.on_job_end(nested, finished(["trainer.lr=5"], JobStatus.COMPLETED, 9.0))
    new.on_multirun_end(job_config(tmp_path, 0))
    table = [line.split() for line in capsys.readouterr().out.splitlines() if line.strip().startswith("job ")]
    assert table == [["job", "0", "val_loss", "9.0000", "trainer.lr=5"]]

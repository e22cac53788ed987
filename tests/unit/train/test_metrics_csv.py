"""metrics.csv on resume: the rows up to the checkpoint's step stay, the rows of steps trained
again are replaced, and a column that appears later extends the header over the old rows."""

import csv

from tinytrain.train.metrics_csv import ResumableCSVLogger


def rows(path):
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_a_resumed_run_continues_the_file(tmp_path):
    first = ResumableCSVLogger(tmp_path, resume_step=None)
    for step in range(6):  # a run that trained 6 steps, checkpointed at step 4, then was killed
        first.log_metrics({"loss": 10.0 - step}, step=step)
    first.log_metrics({"val_loss": 7.5}, step=3)
    assert len(rows(tmp_path / "metrics.csv")) == 7  # written as it goes: a SIGKILL loses nothing

    resumed = ResumableCSVLogger(tmp_path, resume_step=4)
    resumed.log_metrics({"loss": 5.5, "loss_scale": 1024.0}, step=4)
    resumed.log_metrics({"loss": 4.5, "loss_scale": 1024.0}, step=5)
    got = rows(tmp_path / "metrics.csv")
    assert [(r["step"], r["loss"], r["val_loss"], r["loss_scale"]) for r in got] == [
        ("0", "10.0", "", ""),
        ("1", "9.0", "", ""),
        ("2", "8.0", "", ""),
        ("3", "7.0", "", ""),
        ("3", "", "7.5", ""),
        ("4", "5.5", "", "1024.0"),
        ("5", "4.5", "", "1024.0"),
    ]


def test_a_fresh_run_starts_a_new_file(tmp_path):
    (tmp_path / "metrics.csv").write_text("loss,step\n1.0,0\n")
    fresh = ResumableCSVLogger(tmp_path, resume_step=None)
    fresh.log_metrics({"loss": 2.0}, step=0)
    assert [r["loss"] for r in rows(tmp_path / "metrics.csv")] == ["2.0"]


def test_a_last_line_cut_by_a_crash_is_dropped_on_resume(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("loss,step,val_loss\n10.0,0,\n9.0,1,\n8.0,2,\n7.")  # killed while writing step 3's row
    resumed = ResumableCSVLogger(tmp_path, resume_step=3)
    resumed.log_metrics({"loss": 7.25}, step=3)
    assert [(r["step"], r["loss"]) for r in rows(path)] == [("0", "10.0"), ("1", "9.0"), ("2", "8.0"), ("3", "7.25")]


def test_a_row_missing_fields_is_dropped_on_resume(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("loss,step,val_loss\n10.0,0,\n9.0\n")  # a cut line that still ends the file with a newline
    resumed = ResumableCSVLogger(tmp_path, resume_step=2)
    resumed.log_metrics({"loss": 8.0}, step=1)
    assert [(r["step"], r["loss"]) for r in rows(path)] == [("0", "10.0"), ("1", "8.0")]


def test_a_row_written_before_a_checkpoint_is_not_written_twice(tmp_path):
    """write_step_row_now writes a step's row before the save; Lightning's own copy is skipped,
    and a later row of the same step (the validation after it) is not."""
    logger = ResumableCSVLogger(tmp_path, resume_step=None)
    logger.log_early({"loss": 3.0, "epoch": 0}, step=7)
    assert [(r["step"], r["loss"]) for r in rows(tmp_path / "metrics.csv")] == [("7", "3.0")]  # on disk already
    logger.log_metrics({"loss": 3.0, "epoch": 0}, step=7)
    logger.log_metrics({"val_loss": 2.5, "epoch": 0}, step=7)
    assert [(r["step"], r["loss"], r["val_loss"]) for r in rows(tmp_path / "metrics.csv")] == [("7", "3.0", ""), ("7", "", "2.5")]


def test_a_stray_rank_variable_does_not_silence_a_single_run_s_metrics(monkeypatch):
    """Lightning reads LOCAL_RANK alone as its rank: `LOCAL_RANK=1` left in a shell made a single
    run write no metrics.csv and no curve, with exit 0."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from tinytrain.train.trainer import rank_zero_where_no_launcher

    monkeypatch.setattr(rank_zero_only, "rank", 1)  # as Lightning set it from the stray variable
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("SLURM_PROCID", raising=False)
    rank_zero_where_no_launcher()
    assert rank_zero_only.rank == 0
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    monkeypatch.setenv("WORLD_SIZE", "2")  # a launcher's rank 1: left alone
    rank_zero_where_no_launcher()
    assert rank_zero_only.rank == 1

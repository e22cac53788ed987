"""The wandb run id of a run directory (train/trainer.py wandb_run_id)."""

import shutil

from tinytrain.train.trainer import WANDB_ID_FILE, wandb_run_id


def test_a_run_directory_keeps_its_wandb_id_and_a_new_one_of_the_same_name_gets_its_own(tmp_path):
    """The id was the name and a hash of the path: a new `run.name=debug`, its directory deleted
    and made again, continued the old wandb run's history."""
    run_dir = tmp_path / "runs" / "debug"
    run_dir.mkdir(parents=True)
    first = wandb_run_id("debug", run_dir)
    assert first.startswith("debug-") and wandb_run_id("debug", run_dir) == first  # a resume, another rank
    assert (run_dir / WANDB_ID_FILE).read_text().strip() == first
    shutil.rmtree(run_dir)
    run_dir.mkdir()
    assert wandb_run_id("debug", run_dir) != first
    assert wandb_run_id("a/b c", tmp_path).startswith("a-b-c-")  # only the characters wandb ids take


def test_a_run_of_an_older_tinytrain_continues_its_wandb_run(tmp_path):
    """Before the id was kept in the directory, it was wandb's folder's only record: resuming such
    a run started a second wandb run."""
    run_dir = tmp_path / "runs" / "wb"
    (run_dir / "wandb" / "offline-run-20261130_101500-wb-dd3ec801").mkdir(parents=True)
    (run_dir / "wandb" / "run-20261129_090000-wb-0ld").mkdir()
    (run_dir / "wandb" / "latest-run").mkdir()  # wandb's own link, no run of its own
    assert wandb_run_id("wb", run_dir) == "wb-dd3ec801"  # the newest
    assert (run_dir / WANDB_ID_FILE).read_text().strip() == "wb-dd3ec801"

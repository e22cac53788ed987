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

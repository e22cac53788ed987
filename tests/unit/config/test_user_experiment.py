"""A user's own experiment in --config-dir (as docs/install.md shows for model=) is an option like
the package's: the check that names a missing one globbed the package's folder alone and refused it,
while its fix said to add it to your own --config-dir."""

import json

from tests.cli_in_process import run_in_process


def test_an_experiment_in_the_user_s_config_dir_is_applied(tmp_path):
    (tmp_path / "conf" / "experiment").mkdir(parents=True)
    (tmp_path / "conf" / "experiment" / "mine.yaml").write_text("# @package _global_\ntrainer:\n  max_steps: 4\n  warmup_steps: 1\n")
    code, err = run_in_process(["--config-dir", str(tmp_path / "conf"), "experiment=mine", "mode=plan", f"hydra.run.dir={tmp_path / 'run'}"])
    assert code == 0, err
    assert json.loads((tmp_path / "run" / "plan.json").read_text())["max_steps"] == 4
    code, err = run_in_process(["--config-dir", str(tmp_path / "conf"), "experiment=theirs", "mode=plan", f"hydra.run.dir={tmp_path / 'run2'}"])
    assert code == 2 and "experiment='theirs': no such option" in err and "mine" in err, err

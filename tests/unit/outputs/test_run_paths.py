"""An export or eval run from another folder reads the run's relative paths where the run ran
(outputs/saved_run.py run_paths): `model.pretrained=models/base` was looked for under the new
folder, then on the hub."""

from omegaconf import OmegaConf

from tinytrain.outputs.saved_run import run_config


def test_relative_paths_are_read_from_the_folder_the_run_ran_in(tmp_path, monkeypatch):
    ran_in, run = tmp_path / "project", tmp_path / "project" / "runs" / "ft"
    (ran_in / "models" / "base").mkdir(parents=True)
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save({"model": {"pretrained": "models/base"}, "checkpoint": {"init_from": "org/hub-model"}}, run / "config_resolved.yaml")
    OmegaConf.save({"hydra": {"runtime": {"cwd": str(ran_in)}}}, run / ".hydra" / "hydra.yaml")
    monkeypatch.chdir(tmp_path)  # elsewhere: models/base is not here
    cfg = run_config(run / "config_resolved.yaml")
    assert cfg.model.pretrained == str(ran_in / "models" / "base")
    assert cfg.checkpoint.init_from == "org/hub-model"  # a hub id stays
    monkeypatch.chdir(ran_in)  # where it ran, the path is as typed
    assert run_config(run / "config_resolved.yaml").model.pretrained == "models/base"

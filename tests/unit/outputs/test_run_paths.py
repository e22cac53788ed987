"""An export or eval run from another folder reads the files its run read (outputs/saved_run.py
run_paths): relative paths where the run ran (`model.pretrained=models/base` was looked for under
the new folder, then on the hub; an eval scored a same-named corpus of its own folder), and the
package's assets from the package as installed now."""

import pytest
from omegaconf import OmegaConf

from tinytrain.config.resolvers import ASSETS, register_resolvers
from tinytrain.outputs.saved_run import run_config


@pytest.fixture(autouse=True)
def resolvers():
    register_resolvers()  # the schema's defaults (tokenizer.path: ${tt.asset:...}), as the CLI has them


def saved_run(tmp_path, config: dict):
    ran_in, run = tmp_path / "project", tmp_path / "project" / "runs" / "ft"
    (run / ".hydra").mkdir(parents=True)
    OmegaConf.save(config, run / "config_resolved.yaml")
    OmegaConf.save({"hydra": {"runtime": {"cwd": str(ran_in)}}}, run / ".hydra" / "hydra.yaml")
    return ran_in, run / "config_resolved.yaml"


def test_relative_paths_are_read_from_the_folder_the_run_ran_in(tmp_path, monkeypatch):
    ran_in, record = saved_run(tmp_path, {"model": {"pretrained": "models/base"}, "checkpoint": {"init_from": "org/hub-model"}})
    (ran_in / "models" / "base").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)  # elsewhere: models/base is not here
    cfg = run_config(record)
    assert cfg.model.pretrained == str(ran_in / "models" / "base")
    assert cfg.checkpoint.init_from == "org/hub-model"  # a hub id stays
    monkeypatch.chdir(ran_in)  # where it ran, the same folder
    assert run_config(record).model.pretrained == str(ran_in / "models" / "base")


def test_a_same_named_file_here_is_not_the_run_s(tmp_path, monkeypatch):
    """The eval scored ./corpus.txt of the folder it ran in: another corpus, with no word of it."""
    ran_in, record = saved_run(tmp_path, {"data": {"path": "corpus.txt", "sources": [{"path": "a.jsonl", "weight": 1.0}]}})
    (ran_in / "corpus.txt").write_text("the run's corpus")
    (ran_in / "a.jsonl").write_text("{}")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "corpus.txt").write_text("another corpus")
    (elsewhere / "a.jsonl").write_text("{}")
    monkeypatch.chdir(elsewhere)
    cfg = run_config(record)
    assert cfg.data.path == str(ran_in / "corpus.txt") and cfg.data.sources[0].path == str(ran_in / "a.jsonl")
    # Gone where it ran (the run moved, or came from another machine) but here by that name: named
    # where the run read it, as a missing file, not this folder's corpus (it was scored silently).
    (ran_in / "corpus.txt").unlink()
    assert run_config(record).data.path == str(ran_in / "corpus.txt")
    (elsewhere / "corpus.txt").unlink()  # nowhere: as typed (a hub id is no file either)
    assert run_config(record).data.path == "corpus.txt"


def test_the_package_s_assets_are_read_where_it_is_installed_now(tmp_path):
    old = f"{tmp_path}/old-venv/site-packages/tinytrain/assets"
    _, record = saved_run(tmp_path, {"tokenizer": {"path": f"{old}/bundled_tokenizer"}, "data": {"path": f"{old}/examples/chat_tiny.jsonl", "val_path": f"{tmp_path}/data/assets/gone.jsonl"}})
    cfg = run_config(record)
    assert cfg.tokenizer.path == str(ASSETS / "bundled_tokenizer") and cfg.data.path == str(ASSETS / "examples" / "chat_tiny.jsonl")
    assert cfg.data.val_path == f"{tmp_path}/data/assets/gone.jsonl"  # not the package's: left to its own error


def test_a_checkpoint_typed_inside_its_folder_finds_its_run(tmp_path, monkeypatch):
    """`cd <run>/checkpoints && tinytrain mode=export checkpoint=final.ckpt`: the relative path's parent
    was `.`, and the checkpoint was said not to be inside a run's checkpoints/ folder."""
    from tinytrain.checkpoint.average import resolve_paths
    from tinytrain.outputs.saved_run import locate

    checkpoints = tmp_path / "run" / "checkpoints"
    checkpoints.mkdir(parents=True)
    for name in ("final.ckpt", "step0000004.ckpt"):
        (checkpoints / name).write_bytes(b"weights")
    monkeypatch.chdir(checkpoints)
    assert locate("final.ckpt", tmp_path / "elsewhere") == checkpoints / "final.ckpt"
    assert resolve_paths(["step0000004.ckpt", "./final.ckpt"], None, tmp_path / "elsewhere")[0].parent == checkpoints


def test_keys_an_older_tinytrain_had_are_left_out_and_said(tmp_path, caplog):
    """logger.csv (removed from the schema) made every mode that read such a run exit 1 with
    omegaconf's ConfigKeyError; free-form maps keep whatever keys they hold."""
    _, record = saved_run(tmp_path, {"logger": {"csv": True, "wandb": False}, "model": {"retired": {"a": 1}}, "parallel": {"deepspeed_overrides": {"zero_optimization": {"reduce_bucket_size": 5}}}})
    with caplog.at_level("WARNING"):
        cfg = run_config(record)
    assert "csv" not in cfg.logger and "retired" not in cfg.model and cfg.logger.wandb is False
    assert cfg.parallel.deepspeed_overrides.zero_optimization.reduce_bucket_size == 5
    assert "keys this one no longer has, left out: " in caplog.text and "logger.csv" in caplog.text and "model.retired" in caplog.text


def test_an_interpolation_in_a_saved_run_s_config_is_refused_not_resolved_here(tmp_path, monkeypatch):
    """tinytrain writes config_resolved.yaml resolved: a `${oc.env:...}` put there since printed
    this machine's variable as the data's name and wrote it to eval.json."""
    from tinytrain.errors import ConfigError

    monkeypatch.setenv("TT_TEST_SECRET", "hunter2")
    _, record = saved_run(tmp_path, {"data": {"name": "${oc.env:TT_TEST_SECRET}", "sources": [{"path": "${data.name}.jsonl", "weight": 1.0}]}})
    with pytest.raises(ConfigError) as e:
        run_config(record)
    keys = [(p.key, p.value) for p in e.value.problems]
    assert keys == [("data.name", "${oc.env:TT_TEST_SECRET}"), ("data.sources[0].path", "${data.name}.jsonl")]
    assert "hunter2" not in e.value.render() and "never writes there" in e.value.problems[0].message

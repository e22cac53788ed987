"""mode=export|eval|generate of a run copied from elsewhere: its saved `model.trust_remote_code:
true` had transformers import its base folder's Python code (the log even said so when the
command gave model.trust_remote_code=false). Only the command's own setting counts."""

import json

import pytest
import torch
from omegaconf import OmegaConf

from tests.conftest import compose
from tinytrain.errors import ConfigError
from tinytrain.outputs.saved_run import load


def colleagues_run(tmp_path):
    """A run whose base model folder carries code (auto_map) that leaves a marker when imported."""
    base = tmp_path / "base"
    base.mkdir()
    marker = tmp_path / "ran"
    (base / "configuration_evil.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    (base / "config.json").write_text(json.dumps({"model_type": "llama", "auto_map": {"AutoConfig": "configuration_evil.EvilConfig"}}))
    run = tmp_path / "colleague"
    (run / "checkpoints").mkdir(parents=True)
    cfg = compose([f"model.pretrained={base}", "model.trust_remote_code=true"])
    OmegaConf.save(OmegaConf.to_container(cfg, resolve=True), run / "config_resolved.yaml")  # as training writes it
    checkpoint = run / "checkpoints" / "final.ckpt"
    torch.save({"global_step": 1, "state_dict": {}}, checkpoint)
    return checkpoint, marker, base


def test_a_saved_run_s_trust_remote_code_is_not_this_command_s(tmp_path):
    checkpoint, marker, base = colleagues_run(tmp_path)
    with pytest.raises(ConfigError) as e:
        load(str(checkpoint), tmp_path)
    problem = e.value.problems[0]
    assert problem.key == "model.trust_remote_code" and f"its run's model.pretrained={base} needs the folder's own Python code" in problem.message
    assert "set model.trust_remote_code=true" in problem.fix
    assert not marker.exists()

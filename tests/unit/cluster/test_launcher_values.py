"""hydra.launcher.* values that submitit writes into a multirun's Slurm script (issue 31), checked
like cluster.* (tinytrain/cluster/launcher_values.py). The CLI's refusal, before anything is
submitted, is in tests/unit/test_bad_inputs_hardening.py ("sweep ..." cases)."""

import dataclasses
import typing

import pytest
from omegaconf import OmegaConf

from tinytrain.cluster.launcher_values import SLURM_LAUNCHER, launcher_problems
from tinytrain.config import CONF_DIR

INJECTED = "x\necho PWNED"


def composed_launcher(overrides: list[str]) -> dict:
    from hydra import compose, initialize_config_dir

    from tinytrain.config.resolvers import register_resolvers
    from tinytrain.config.schema import register_schemas

    register_resolvers()
    register_schemas()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(config_name="config", overrides=overrides, return_hydra_config=True)
    return OmegaConf.to_container(cfg.hydra.launcher, resolve=True)


@pytest.mark.parametrize("launcher", ["submitit_slurm", "slurm_a800", "slurm_v100"])
def test_the_shipped_launchers_and_ordinary_values_pass(launcher):
    values = composed_launcher([f"hydra/launcher={launcher}", "hydra.launcher.partition='gpu,a800'", "hydra.launcher.account=my-project", "hydra.launcher.gres=gpu:8", "hydra.launcher.constraint='a100&ib'", "hydra.launcher.comment=lr_sweep", "hydra.launcher.setup=['module load cuda/12.4', 'source venv/bin/activate']", "+hydra.launcher.additional_parameters.mail-type=END"])
    assert launcher_problems(values) == []


def string_fields() -> list[str]:
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf

    hints = typing.get_type_hints(SlurmQueueConf)
    return [f.name for f in dataclasses.fields(SlurmQueueConf) if f.name != "_target_" and hints[f.name] in (str, typing.Optional[str])]


def test_every_text_value_of_the_launcher_schema_is_checked():
    """Each str key submitit's SlurmQueueConf has (partition, account, qos, comment, constraint,
    exclude, gres, mem_per_*, name, submitit_folder), with a newline in it, is refused by its key."""
    fields = string_fields()
    assert {"partition", "account", "qos", "comment", "constraint", "exclude", "gres", "name", "submitit_folder"} <= set(fields)
    for name in fields:
        problems = launcher_problems({"_target_": SLURM_LAUNCHER, name: INJECTED})
        assert [p.key for p in problems] == [f"hydra.launcher.{name}"], name
        assert "newline" in problems[0].message


def test_lists_and_additional_parameters_are_checked():
    problems = launcher_problems(
        {
            "_target_": SLURM_LAUNCHER,
            "setup": ["module load cuda", INJECTED],
            "srun_args": ["--cpu-bind=none", INJECTED],
            "additional_parameters": {"mail-type": "END --nodes=64", "nodes=64 --x": 1, "exclusive": True, "mem": 0},
        }
    )
    assert [p.key for p in problems] == ["hydra.launcher.setup[1]", "hydra.launcher.srun_args[1]", "hydra.launcher.additional_parameters.mail-type", "hydra.launcher.additional_parameters.nodes=64 --x"]
    assert "whitespace" in problems[2].message and "cannot be an sbatch option name" in problems[3].message


def test_what_the_check_prevents_and_what_it_leaves_alone():
    """submitit's own rendering carries a newline out of its #SBATCH line; the local launchers
    write no script, so nothing of theirs is checked."""
    from submitit.slurm.slurm import _make_sbatch_string

    script = _make_sbatch_string(command="true", folder="/tmp/f", partition="gpu\necho PWNED #")
    assert "\necho PWNED #'\n" in script
    assert launcher_problems({"_target_": "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher", "name": INJECTED}) == []

"""mode=sbatch carries data, never code: crafted values either are refused (naming key, value and
fix) or reach the job as the same bytes, with the #SBATCH block unchanged and no marker command run.

The script is run for real by bash, with stand-ins for `srun` (records its argv) and `scontrol`
on PATH; the refusals go through the CLI in tests/unit/test_bad_inputs_hardening.py.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import compose
from tinytrain.cluster import sbatch, slurm_values
from tinytrain.errors import ConfigError

BASE = ["mode=sbatch", "run.name=job", "cluster=slurm", "cluster.devices=2", "parallel=ddp", "cluster.partition=gpu", "cluster.account=proj"]
# Values that are data for the training run (prompts, tags): accepted, and must arrive unchanged.
HOSTILE_DATA = {
    "semicolon": "a; touch {M}",
    "command substitution": "$(touch {M})",
    "backticks": "`touch {M}`",
    "single quote": "it's'; touch {M}; '",
    "double quote": 'say "$(touch {M})"',
    "leading dashes": "--nodes=64 --wrap=touch {M}",
    "pipe and ampersand": "x | touch {M} & y",
}

STUB_SRUN = """#!/bin/bash
for a in "$@"; do printf '%s\\0' "$a"; done > "$ARGV_FILE"
"""
STUB_SCONTROL = """#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then echo node1; else echo "NodeName=node1 NodeAddr=10.0.0.1 State=IDLE"; fi
"""


def directive_block(script: str) -> list[str]:
    """The #SBATCH lines as sbatch reads them: up to the first line that is neither a comment nor blank."""
    block = []
    for line in script.splitlines()[1:]:
        if line.strip() and not line.startswith("#"):
            break
        if line.startswith("#SBATCH"):
            block.append(line)
    return block


@pytest.fixture(scope="module")
def stubs(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stubs")
    for name, text in (("srun", STUB_SRUN), ("scontrol", STUB_SCONTROL)):
        (folder / name).write_text(text)
        (folder / name).chmod(0o755)
    return folder


@pytest.fixture(scope="module")
def clean_script():
    """The directives of the same job without hostile values: what every hostile script must keep."""
    cfg = compose(BASE)
    return directive_block(sbatch.render(cfg, overrides=BASE, run_dir=Path("/runs/r"), workdir=Path("/repo"), python="python"))


def run_script(script: Path, stubs: Path, tmp_path: Path) -> list[str]:
    argv_file = tmp_path / "argv"
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "ARGV_FILE": str(argv_file), "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": "7"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return argv_file.read_bytes().decode().split("\0")[:-1]


@pytest.mark.parametrize("field", ["generate.prompts", "logger.wandb_tags"])
@pytest.mark.parametrize("kind", list(HOSTILE_DATA))
def test_hostile_override_values_stay_data(kind, field, stubs, clean_script, tmp_path):
    marker = tmp_path / "MARKER"
    value = HOSTILE_DATA[kind].format(M=marker)
    # Hydra's own quoting of a list element: the value inside double quotes, escaped for Hydra.
    override = f"{field}=[{hydra_quote(value)}]"
    overrides = [*BASE, override]
    cfg = compose(overrides)
    assert list(cfg[field.split(".")[0]][field.split(".")[1]]) == [value]
    assert sbatch.sbatch_problems(cfg, overrides, tmp_path / "run") == []
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    path = sbatch.write(cfg, overrides, run_dir)
    script = path.read_text()
    assert [d.replace(str(run_dir.resolve()), "/runs/r").replace(str(Path.cwd().resolve()), "/repo") for d in directive_block(script)] == clean_script
    argv = run_script(path, stubs, tmp_path)
    assert not marker.exists(), script
    assert argv[argv.index("tinytrain") + 1 :] == [*sbatch.training_overrides(overrides), f"hydra.run.dir={run_dir.resolve()}"]
    # The echo of the command line is one comment line that gives back the same overrides.
    echo = next(line for line in script.splitlines() if line.startswith("#   python -m tinytrain "))
    assert shlex.split(echo.removeprefix("#   python -m tinytrain ")) == overrides


def hydra_quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# (override, key named, words of the message); all would have been written into job.sbatch before.
REFUSED = {
    "run name with a newline": ("run.name='a\ntouch M'", "run.name", "newline"),
    "run name with a space": ("run.name='a touch'", "run.name", "whitespace"),
    "run name as an option": ("run.name='--nodes=64'", "run.name", "starts with '-'"),
    "run name with command substitution": ("run.name='$(touch M)'", "run.name", "cannot be a Slurm job name"),
    "partition with a newline": ("cluster.partition='gpu\ntouch M'", "cluster.partition", "newline"),
    "partition with an option": ("cluster.partition='gpu --nodes=64'", "cluster.partition", "whitespace"),
    "partition as an option": ("cluster.partition='--nodes=64'", "cluster.partition", "starts with '-'"),
    "partition with a semicolon": ("cluster.partition='gpu;touch'", "cluster.partition", "not a Slurm name"),
    "account with an option": ("cluster.account='acct --nodes=64'", "cluster.account", "whitespace"),
    "account with a newline": ("cluster.account='acct\ntouch M'", "cluster.account", "newline"),
    "account with backticks": ("cluster.account='`touch M`'", "cluster.account", "not a Slurm name"),
    "account with a quote": ("cluster.account='acct\"x'", "cluster.account", "not a Slurm name"),
    "account list": ("cluster.account='a,b'", "cluster.account", "not a Slurm name"),
    "time with a newline": ("cluster.time='1:00:00\ntouch M'", "cluster.time", "newline"),
    "time with an option": ("cluster.time='1:00:00 --nodes=64'", "cluster.time", "whitespace"),
    "override with a newline": ("+logger.wandb_tags=['x\ntouch M']", "logger.wandb_tags", "newline"),
    "override with a carriage return": ("generate.prompts=['x\rtouch M']", "generate.prompts", "control character"),
    "run dir with a space": ("hydra.run.dir='{T}/my run'", "hydra.run.dir", "whitespace"),
    "run dir with a newline": ("hydra.run.dir='{T}/a\ntouch M'", "hydra.run.dir", "newline"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_values_slurm_would_misread_are_refused_before_writing(name, tmp_path):
    override, key, words = REFUSED[name]
    override = override.replace("{T}", str(tmp_path))
    overrides = [*BASE, override]
    cfg = compose([o for o in overrides if not o.startswith("hydra.")])
    run_dir = Path(override.split("=", 1)[1].strip("'")) if override.startswith("hydra.") else tmp_path / "run"
    problems = sbatch.sbatch_problems(cfg, overrides, run_dir)
    assert [p.key for p in problems] == [key], problems
    assert words in problems[0].message and problems[0].fix
    with pytest.raises(ConfigError):
        sbatch.write(cfg, overrides, run_dir)
    assert not (run_dir / sbatch.SCRIPT_NAME).exists() and not (tmp_path / sbatch.SCRIPT_NAME).exists()


def test_partition_lists_and_plain_names_are_accepted():
    assert slurm_values.name_problems("cluster.partition", "a800,v100", "", allow_list=True) == []
    assert slurm_values.name_problems("cluster.account", "my-proj_2.x", "") == []
    assert slurm_values.job_name_problems("sweep-x1/run7") == [] and slurm_values.job_name_problems("2026-01-01_10-00-00") == []


def test_a_comment_never_ends_whatever_it_is_given():
    assert "\n" not in slurm_values.comment_safe("a\nb\rc\x00") and slurm_values.comment_safe("a\nb") == "a\\x0ab"


@pytest.mark.parametrize("kind", ["command substitution", "single quote", "leading dashes"])
def test_the_prepare_array_script_carries_the_same_values_as_data(kind, stubs, tmp_path):
    """mode=sbatch with data.prepare_parts also writes prepare.sbatch (the store as an array job)."""
    from tinytrain.cluster import prepare_array

    marker = tmp_path / "MARKER"
    text = tmp_path / "docs.txt"
    text.write_text("One document.\n\nAnother.\n")
    override = f"generate.prompts=[{hydra_quote(HOSTILE_DATA[kind].format(M=marker))}]"
    overrides = [*BASE, "data=text", f"data.path={text}", "data.prepare_parts=2", override]
    cfg = compose(overrides)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    prepare_array.write(cfg, overrides, run_dir)
    argv_file = tmp_path / "argv"
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "ARGV_FILE": str(argv_file), "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_JOB_ID": "9", "SLURM_JOB_NODELIST": "node1"}
    done = subprocess.run(["bash", str(run_dir / prepare_array.PREPARE_NAME)], env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    argv = argv_file.read_bytes().decode().split("\0")[:-1]
    assert not marker.exists()
    assert argv[argv.index("tinytrain") + 1 :] == ["mode=prepare", *sbatch.training_overrides(overrides), "data.prepare_part=1", f"hydra.run.dir={run_dir.resolve() / 'prepare'}/part-1"]


def test_the_prepare_array_script_is_refused_like_the_job(tmp_path):
    from tinytrain.cluster import prepare_array

    overrides = [*BASE, "cluster.account='acct --nodes=64'"]
    with pytest.raises(ConfigError, match="cluster.account"):
        prepare_array.write(compose(overrides), overrides, tmp_path)
    assert not (tmp_path / prepare_array.PREPARE_NAME).exists()


def parsed_override(word: str):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create().parse_override(word).value()


def test_a_run_directory_with_hydra_s_own_characters_reaches_the_job_as_itself(stubs, tmp_path):
    """run.name='v=2' (or 'sb,2'): the job's `hydra.run.dir=<...>/v=2` was refused by Hydra's parser
    when it started, after its wait in the queue; the prepare array's parts the same."""
    from tinytrain.cluster import prepare_array

    text = tmp_path / "docs.txt"
    text.write_text("One document.\n\nAnother.\n")
    overrides = [*BASE, "data=text", f"data.path={text}", "data.prepare_parts=2"]
    cfg = compose(overrides)
    run_dir = tmp_path / "v=2,sb"
    run_dir.mkdir()
    argv = run_script(sbatch.write(cfg, overrides, run_dir), stubs, tmp_path)
    assert parsed_override(argv[-1]) == str(run_dir.resolve())
    prepare_array.write(cfg, overrides, run_dir)
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "ARGV_FILE": str(tmp_path / "argv"), "SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_JOB_ID": "9", "SLURM_JOB_NODELIST": "node1"}
    done = subprocess.run(["bash", str(run_dir / prepare_array.PREPARE_NAME)], env=env, capture_output=True, text=True, timeout=30, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    argv = (tmp_path / "argv").read_bytes().decode().split("\0")[:-1]
    assert parsed_override(argv[-1]) == str(run_dir.resolve() / "prepare" / "part-1")


@pytest.mark.parametrize("value", ["/runs/plain-2026_12.01", "/runs/v=2", "/runs/a,b", "/runs/it's", "/runs/[x]", "/runs/back\\", "/runs/b\\'c", "/runs/é"])
def test_hydra_values_read_back_unchanged(value):
    assert parsed_override(f"hydra.run.dir={slurm_values.hydra_value(value)}") == value

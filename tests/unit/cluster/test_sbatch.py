"""mode=sbatch: the job script rendered from the composed config and the command line."""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import compose, run_cli
from tinytrain.cluster.sbatch import render
from tinytrain.errors import ConfigError
from tinytrain.plan.validate import validate

CHAT = 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]'


def directives(script: str) -> list[str]:
    return [line.removeprefix("#SBATCH ") for line in script.splitlines() if line.startswith("#SBATCH ")]


def test_script_asks_for_what_the_plan_assumed(tmp_path):
    overrides = ["mode=sbatch", "cluster=slurm", "cluster.nodes=2", "cluster.partition=a800", "cluster.cpus_per_task=12", "cluster.time=2:00:00", "parallel=ddp", CHAT, "hydra.run.dir=elsewhere"]
    cfg = compose([o for o in overrides if not o.startswith("hydra.")])
    script = render(cfg, overrides=overrides, run_dir=tmp_path / "run", workdir=Path("/repo"), python="python")
    assert directives(script)[1:] == [
        "--nodes=2",
        "--ntasks-per-node=8",
        "--gpus-per-node=8",
        "--cpus-per-task=12",
        "--time=2:00:00",
        "--signal=USR1@300",
        "--requeue",
        "--open-mode=append",
        f"--output={tmp_path / 'run'}/slurm-%j.out",
        "--chdir=/repo",
        "--partition=a800",
    ]
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    argv = shlex.split(srun)
    # The same overrides, quoted for the shell, training into the planned run directory.
    assert argv[argv.index("tinytrain") + 1 :] == ["cluster=slurm", "cluster.nodes=2", "cluster.partition=a800", "cluster.cpus_per_task=12", "cluster.time=2:00:00", "parallel=ddp", CHAT, f"hydra.run.dir={tmp_path / 'run'}", "$@"]


def test_sbatch_needs_cluster_slurm():
    with pytest.raises(ConfigError) as e:
        validate(compose(["mode=sbatch"]))
    assert "cluster='local'" in str(e.value) and "add cluster=slurm" in str(e.value)
    with pytest.raises(ConfigError) as e:
        validate(compose(["mode=sbatch", "cluster=slurm", "parallel=ddp", "cluster.signal_delay_s=-1"]))
    assert "cluster.signal_delay_s=-1" in str(e.value)


def test_cli_writes_the_script_next_to_the_plan(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(["mode=sbatch", "cluster=slurm", "cluster.devices=4", "parallel=ddp", "hardware.gpu=A800"], run_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (run_dir / "plan.json").exists()
    assert "world size 4 = tp 1 x dp 4" in r.stdout
    assert f"sbatch {run_dir / 'job.sbatch'}" in r.stdout
    script = (run_dir / "job.sbatch").read_text()
    assert "--ntasks-per-node=4" in directives(script) and "mode=sbatch" not in script.split("#SBATCH")[-1]
    # The plan's host line, with the --mem that asks for it, as a comment (4 ranks each build tiny in fp32).
    assert "# Host memory per node at peak (the plan's host line): 4.0 GiB. Where the partition gives a job less by default, add: #SBATCH --mem=5G" in script.splitlines()


def test_the_prepare_array_quotes_every_value_and_training_waits_for_it(tmp_path):
    from tinytrain.cluster.prepare_array import render_prepare, render_submit

    hostile = "data.path=/data/a b;$(touch pwned)"
    overrides = ["mode=sbatch", "cluster=slurm", "cluster.cpus_per_task=4", "data=text", hostile, "data.prepare_parts=3", "data.prepare_part=1"]
    cfg = compose(["cluster=slurm", "cluster.cpus_per_task=4", "data=text", "data.prepare_parts=3"])
    script = render_prepare(cfg, overrides=overrides, run_dir=tmp_path / "run", workdir=Path("/repo"), python="python")
    assert "--array=0-2" in directives(script) and "--requeue" in directives(script) and "--cpus-per-task=32" in directives(script)
    assert not any(d.startswith("--gpus") for d in directives(script))
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    argv = shlex.split(srun)
    assert hostile in argv and "data.prepare_part=1" not in argv  # one word, the user's own part number dropped
    assert argv[-2:] == ["data.prepare_part=${part}", f"hydra.run.dir={tmp_path / 'run'}/prepare/part-${{part}}"]
    submit = render_submit(tmp_path / "run", 3)
    assert f'--dependency="afterok:${{prepare}}" {tmp_path / "run"}/job.sbatch' in submit
    for text in (script, submit):
        assert subprocess.run(["bash", "-n"], input=text, text=True).returncode == 0


def test_interpolations_on_the_command_line_reach_the_job_as_typed(tmp_path, monkeypatch):
    """Hydra's list of overrides resolved each one when read: a relative interpolation raised
    (exit 1), and an oc.env was read on the login node into the job's command line."""
    from tests.cli_in_process import run_in_process

    monkeypatch.setenv("SCRATCHX", str(tmp_path / "login"))
    typed = ["data.cache_dir=${oc.env:SCRATCHX}/cache", "trainer.warmup_steps=${.micro_batch_size}"]
    run_dir = tmp_path / "run"
    code, err = run_in_process(["mode=sbatch", "cluster=slurm", "parallel=ddp", "hardware.gpu=A800", *typed, f"hydra.run.dir={run_dir}"])
    assert code == 0, err
    srun = next(line for line in (run_dir / "job.sbatch").read_text().splitlines() if line.startswith("srun "))
    assert shlex.split(srun)[-4:-2] == typed


def test_the_user_s_hydra_settings_reach_the_job(tmp_path):
    """The script passed on the task's overrides only: `hydra/job_logging=stdout` on the command
    line that wrote it did not reach the job it wrote."""
    from tests.cli_in_process import run_in_process

    run_dir = tmp_path / "run"
    hydra = ["hydra/job_logging=stdout", "hydra.verbose=true"]
    code, err = run_in_process(["mode=sbatch", "cluster=slurm", "parallel=ddp", "hardware.gpu=A800", *hydra, f"hydra.run.dir={run_dir}"])
    assert code == 0, err
    srun = next(line for line in (run_dir / "job.sbatch").read_text().splitlines() if line.startswith("srun "))
    args = shlex.split(srun)
    assert args[-4:-2] == hydra and args[-2] == f"hydra.run.dir={run_dir.resolve()}"
    assert not [a for a in args if a.startswith("hydra.mode")]  # Hydra's own entry, not the user's


def test_slurm_time_limits_read_as_slurm_reads_them():
    """Slurm's parser has no range per field: 00:90:00 and 1-25 were refused as no time limit."""
    from tinytrain.cluster.sbatch import slurm_time_seconds

    assert slurm_time_seconds("00:90:00") == 5400 and slurm_time_seconds("1-25") == 49 * 3600
    assert slurm_time_seconds("90") == 5400 and slurm_time_seconds("UNLIMITED") == 0
    assert slurm_time_seconds("1:2:3:4") is None and slurm_time_seconds("1h") is None

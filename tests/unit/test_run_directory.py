"""A run directory belongs to one run: a second process is refused while the first holds it, and a
plan never overwrites the record of a trained run."""

import os

import pytest

from tests.conftest import compose, run_cli
from tinytrain.checkpoint.run_lock import LOCK_NAME, hold
from tinytrain.cli import run_stages
from tinytrain.errors import ConfigError


def test_a_second_holder_is_refused_naming_the_first(tmp_path):
    with hold(tmp_path, "train"):
        assert f"pid {os.getpid()}" in (tmp_path / LOCK_NAME).read_text()
        with pytest.raises(ConfigError) as e:
            with hold(tmp_path, "plan"):
                pass
        problem = e.value.problems[0]
        assert problem.key == "hydra.run.dir" and f"in use by tinytrain mode=train, pid {os.getpid()}" in problem.message
        assert "run.name=<new>" in problem.fix
    with hold(tmp_path, "train"):  # released when the first run ended
        pass


def test_the_cli_refuses_a_directory_another_process_holds(tmp_path):
    with hold(tmp_path, "train"):
        r = run_cli(["mode=plan"], tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"is in use by tinytrain mode=train, pid {os.getpid()}" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("trained", ["step0000004.ckpt", "final.ckpt"])
@pytest.mark.parametrize("mode", ["plan", "sbatch"])
def test_a_plan_does_not_overwrite_a_trained_run(tmp_path, trained, mode):
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / trained).write_bytes(b"weights")
    (tmp_path / "plan.json").write_text("the trained run's plan")
    with pytest.raises(ConfigError) as e:
        run_stages(compose([f"mode={mode}", *(["cluster=slurm", "parallel=ddp"] if mode == "sbatch" else [])]), tmp_path)
    problem = e.value.problems[0]
    assert problem.key == "hydra.run.dir" and f"holds a trained run (checkpoints/{trained})" in problem.message
    # A new directory alone planned a fresh run: the fix resumes it from the trained run's checkpoint.
    assert f"run.name=<new> resume={tmp_path / 'checkpoints' / trained}" in problem.fix
    assert (tmp_path / "plan.json").read_text() == "the trained run's plan"


def test_sbatch_in_a_trained_job_s_directory_names_its_job_script(tmp_path):
    """mode=sbatch wrote job.sbatch there: resubmitting it continues the run (resume=auto), where
    mode=train on the login node was the fix before."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step0000004.ckpt").write_bytes(b"weights")
    (tmp_path / "job.sbatch").write_text("#!/bin/bash\n")
    with pytest.raises(ConfigError) as e:
        run_stages(compose(["mode=sbatch", "cluster=slurm", "parallel=ddp"]), tmp_path)
    problem = e.value.problems[0]
    assert problem.message.endswith("mode=sbatch here would replace the plan.json and config_resolved.yaml that describe it")
    assert problem.fix.startswith(f"resubmit the job script written there, which continues that run (resume=auto): sbatch {tmp_path / 'job.sbatch'}")
    assert "mode=train" not in problem.fix


def test_a_refused_plan_leaves_the_trained_run_s_hydra_record_as_it_was(tmp_path):
    """Hydra writes .hydra/ (config, overrides) before tinytrain runs: a refused mode=plan in a trained
    run's directory replaced the record of how that run was composed with its own."""
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step0000004.ckpt").write_bytes(b"weights")
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- trainer.max_steps=60\n")
    r = run_cli(["mode=plan"], tmp_path)
    assert r.returncode == 2 and "holds a trained run" in r.stderr, r.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / ".hydra").iterdir()) == ["overrides.yaml"]
    assert (tmp_path / ".hydra" / "overrides.yaml").read_text() == "- trainer.max_steps=60\n"


@pytest.mark.parametrize(("env", "refusal"), [({}, "is in use by tinytrain mode=train"), ({"LOCAL_RANK": "x", "WORLD_SIZE": "2"}, "is not a rank")], ids=["the lock", "a rank that is no number"])
def test_a_process_the_lock_refuses_leaves_the_running_run_s_record(tmp_path, env, refusal):
    """Hydra writes .hydra/ and opens tinytrain.log before the lock is tried: a plan refused while a
    run trained there replaced that run's record of how it was composed (mode=plan, trainer.lr=9)
    and appended its refusal to that run's log (a rank variable's refusal too, its rank unknown)."""
    import socket
    import subprocess
    import sys

    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- trainer.lr=1e-3\n")
    (tmp_path / "tinytrain.log").write_text("the running run's log\n")
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "tinytrain"])  # a training run's process
    try:
        with hold(tmp_path, "train"):
            (tmp_path / LOCK_NAME).write_text(f"tinytrain mode=train, pid {running.pid} on {socket.gethostname()}, since now\n")
            r = run_cli(["mode=plan", "trainer.lr=9"], tmp_path, env=env)
    finally:
        running.kill()
        running.wait()
    assert r.returncode == 2 and refusal in r.stderr, r.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / ".hydra").iterdir()) == ["overrides.yaml"]
    assert (tmp_path / ".hydra" / "overrides.yaml").read_text() == "- trainer.lr=1e-3\n"
    assert (tmp_path / "tinytrain.log").read_text() == "the running run's log\n"  # the refusal is on stderr only
    # Its process gone (the line a killed holder leaves), the record is written again.
    from tinytrain.config.resolvers import running_here

    assert not running_here(tmp_path)


def test_a_launch_the_lock_refuses_never_removes_the_directory_its_holder_made(tmp_path):
    """Two launches of one run.name a moment apart: the second resolved the directory before the
    first made it, was refused the lock, and then removed the directory as one it had made and
    left unused, under the first, still training (its log, record and lock gone with it)."""
    import subprocess
    import sys

    from tests.conftest import REPO

    run_dir = tmp_path / "root" / "twin"
    # The second launch, paused after Hydra's run.dir is resolved until the first holds the lock.
    second = """
import sys, time, tinytrain.config.resolvers as r
resolve = r._run_dir
def paused(root, name):
    out = resolve(root, name)
    print("resolved", flush=True)
    while not (r.Path(out) / r.LOCK_NAME).exists():
        time.sleep(0.05)
    time.sleep(0.2)
    return out
r._run_dir = paused
from tinytrain.cli import main
sys.argv = ["tinytrain", *sys.argv[1:]]
main()
"""
    proc = subprocess.Popen([sys.executable, "-c", second, "mode=plan", f"run.root={tmp_path / 'root'}", "run.name=twin"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "resolved"
        run_dir.mkdir(parents=True)
        with hold(run_dir, "train"):  # the first launch
            (run_dir / "tinytrain.log").write_text("the first launch's log\n")
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 2 and "is in use by tinytrain mode=train" in err, err[-2000:]
            assert (run_dir / "tinytrain.log").read_text().startswith("the first launch's log\n") and (run_dir / LOCK_NAME).exists()
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.parametrize("logging_option", ["disabled", "stdout", "none"])
def test_hydra_s_other_job_logging_options_run_without_tinytrain_log(logging_option, tmp_path):
    """tinytrain set its log file's name into whichever job logging was chosen: on one without a
    file handler that made a handler of no class (a ValueError traceback, exit 1)."""
    from tests.cli_in_process import run_in_process

    code, err = run_in_process(["mode=plan", f"hydra/job_logging={logging_option}", f"hydra.run.dir={tmp_path / 'run'}"])
    assert code == 0, err
    assert (tmp_path / "run" / "plan.json").exists() and not (tmp_path / "run" / "tinytrain.log").exists()


def test_hydra_job_chdir_reads_relative_inputs_where_the_command_ran(tmp_path, monkeypatch):
    """Under hydra.job.chdir=true a relative data.path was looked up in the run directory (refused
    as missing), and each run built its own token store in its own .cache/."""
    from tests.cli_in_process import run_in_process

    monkeypatch.chdir(tmp_path)
    (tmp_path / "corpus.txt").write_text("\n\n".join(f"Document {i} says something about tokens." for i in range(200)))
    for name in ("a", "b"):
        code, err = run_in_process(["mode=prepare", "data=text", "data.path=corpus.txt", "data.seq_len=32", "hydra.job.chdir=true", f"hydra.run.dir={tmp_path / 'runs' / name}"])
        assert code == 0, err
    assert len(list((tmp_path / ".cache").rglob("meta.json"))) >= 1  # one store, where the command ran
    assert not list((tmp_path / "runs").rglob("meta.json"))

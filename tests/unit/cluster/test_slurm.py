"""Slurm: a run name stable across requeues from the job id, array tasks named as scontrol wants
them, Lightning's cluster environment without its own requeue handler; cluster=slurm's nodes and
tasks per node read from srun's environment, plans for a cluster from a login node, and a config
that disagrees with the job stopped before training."""

from __future__ import annotations

import re

import pytest

from tests.conftest import compose
from tinytrain.cli import run_stages
from tinytrain.cluster import slurm
from tinytrain.cluster.slurm import SlurmTask, allocation_problems, current_task
from tinytrain.errors import ConfigError
from tinytrain.plan.validate import validate
from tinytrain.train.trainer import cluster_plugins

# What srun gives each of 2 nodes x 4 tasks (a subset: the variables tinytrain and Lightning read).
SRUN_2x4 = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "tinytrain", "SLURM_NNODES": "2", "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0"}
SLURM_VARS = (*SRUN_2x4, "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID")


@pytest.fixture(autouse=True)
def no_slurm(monkeypatch):
    """Every test starts outside Slurm, even when the suite itself runs in a Slurm job."""
    for var in SLURM_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.fixture
def in_job(monkeypatch):
    """This process as task 0 of srun in a Slurm job with the given variables."""

    def enter(env: dict):
        for key, value in env.items():
            monkeypatch.setenv(key, value)

    return enter


def test_job_ids():
    assert slurm.job_id({}) is None
    assert slurm.job_id({"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "pretrain"}) == "4242"
    array_task = {"SLURM_JOB_ID": "4250", "SLURM_ARRAY_JOB_ID": "4242", "SLURM_ARRAY_TASK_ID": "8"}
    assert slurm.job_id(array_task) == "4242_8"
    assert slurm.run_name(array_task) == "slurm-4242_8"
    # salloc / srun --pty: every command typed there is a run of its own
    assert slurm.job_id({"SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "interactive"}) is None


def test_run_name_comes_from_the_job(no_slurm):
    no_slurm.setenv("SLURM_JOB_ID", "4242")
    assert compose().run.name == "slurm-4242"
    no_slurm.setenv("SLURM_ARRAY_JOB_ID", "4240")
    no_slurm.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert compose().run.name == "slurm-4240_3"
    assert compose(["run.name=mine"]).run.name == "mine"


def test_run_name_outside_slurm_is_the_start_time(no_slurm):
    cfg = compose()
    # To the millisecond: launches started together (a shell loop's `&`) shared one second's directory.
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d{3}", cfg.run.name)
    assert cfg.run.name == cfg.run.name  # one value per config, however often it is read


def test_torchrun_s_ranks_are_refused_the_default_name(no_slurm, tmp_path):
    """Each rank torchrun starts made its own timestamp: ranks a second apart trained into two directories."""
    from tests.cli_in_process import run_in_process

    no_slurm.setenv("TORCHELASTIC_RUN_ID", "none")
    no_slurm.setenv("RANK", "0")
    no_slurm.setenv("WORLD_SIZE", "2")
    no_slurm.chdir(tmp_path)
    code, err = run_in_process(["mode=plan", "experiment=smoke"])
    assert code == 2 and "run.name=<name>" in err and not (tmp_path / "runs").exists(), err
    assert compose().run.name == "unnamed"  # harmless where the command gives hydra.run.dir itself,
    code, err = run_in_process(["mode=plan", "experiment=smoke", f"hydra.run.dir={tmp_path / 'given'}"])
    assert code == 0 and "name: given" in (tmp_path / "given" / "config_resolved.yaml").read_text(), err  # which names it
    code, err = run_in_process(["mode=plan", "experiment=smoke", "run.name=unnamed"])  # a user's own name of that spelling
    assert code == 0 and (tmp_path / "runs" / "unnamed" / "plan.json").exists(), err
    no_slurm.delenv("TORCHELASTIC_RUN_ID")  # a pod's RANK and WORLD_SIZE, DeepSpeed's launcher: alike
    code, err = run_in_process(["mode=plan", "experiment=smoke"])
    assert code == 2 and "run.name=<name>" in err, err
    no_slurm.delenv("RANK")
    assert compose(["run.name=mine"]).run.name == "mine"
    no_slurm.setenv("WORLD_SIZE", "1")  # one process: nobody to disagree with
    assert compose().run.name


def test_lightning_requeue_handler_is_off_under_srun(no_slurm):
    assert cluster_plugins() == []
    no_slurm.setenv("SLURM_NTASKS", "2")
    no_slurm.setenv("SLURM_NTASKS_PER_NODE", "2")
    no_slurm.setenv("SLURM_JOB_ID", "4242")
    (env,) = cluster_plugins()
    assert type(env).__name__ == "SLURMEnvironment" and env.auto_requeue is False


def test_requeue_reports_a_missing_scontrol(no_slurm):
    no_slurm.setenv("PATH", "/nonexistent")
    ok, what = slurm.requeue("4242")
    assert not ok and "scontrol requeue 4242 failed" in what


def test_a_requeue_s_sigterm_is_ignored_while_its_outcome_is_said():
    """The requeue's SIGTERM arrives inside the block and changes nothing; the handler before it is back after."""
    import os
    import signal

    before = signal.getsignal(signal.SIGTERM)
    with slurm.sigterm_ignored():
        os.kill(os.getpid(), signal.SIGTERM)  # would end this process with the default handler
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
    assert signal.getsignal(signal.SIGTERM) is before


def test_task_read_from_srun_environment():
    assert current_task({}) is None
    assert current_task(SRUN_2x4) == SlurmTask("4242", nodes=2, tasks=8, tasks_per_node=4, from_srun=True)
    batch_script = {k: v for k, v in SRUN_2x4.items() if k != "SLURM_STEP_ID"}
    assert current_task(batch_script).from_srun is False
    # Lightning leaves salloc shells (job name bash / interactive) alone, and so does tinytrain.
    assert current_task({**SRUN_2x4, "SLURM_JOB_NAME": "interactive"}) is None


def test_matching_config_has_no_problems():
    assert allocation_problems(2, 4, "slurm", current_task(SRUN_2x4)) == []
    assert allocation_problems(5, 3, "local", None) == []


def test_mismatch_names_both_values_and_the_fix():
    (nodes,) = allocation_problems(1, 4, "slurm", current_task(SRUN_2x4))
    assert (nodes.key, nodes.value) == ("cluster.nodes", 1)
    assert "runs on 2 node(s)" in nodes.message and "--nodes=1" in nodes.fix and "remove the override" in nodes.fix
    (devices,) = allocation_problems(2, 8, "local", current_task(SRUN_2x4))
    assert (devices.key, devices.value) == ("cluster.devices", 8)
    assert "4 task(s) per node" in devices.message and "use cluster=slurm" in devices.fix


def test_python_in_the_batch_script_of_a_multi_task_job():
    batch_script = {k: v for k, v in SRUN_2x4.items() if k != "SLURM_STEP_ID"}
    (p,) = allocation_problems(2, 4, "slurm", current_task(batch_script))
    assert p.key == "cluster" and "srun python -m tinytrain" in p.fix and "7 rank(s) that never start" in p.message


def test_ntasks_without_tasks_per_node():
    env = {k: v for k, v in SRUN_2x4.items() if k != "SLURM_NTASKS_PER_NODE"}
    (p,) = allocation_problems(2, 4, "slurm", current_task(env))
    assert p.key == "cluster.devices" and "--ntasks-per-node" in p.fix


def test_srun_with_fewer_tasks_than_the_allocation():
    # `srun -n1` inside a 2 x 4 job: the step has 1 task, the job's variables still say 4 per node.
    env = {**SRUN_2x4, "SLURM_NNODES": "1", "SLURM_NTASKS": "1"}
    (p,) = allocation_problems(1, 4, "slurm", current_task(env))
    assert p.key == "cluster" and "srun started 1 task(s)" in p.message


def test_plan_on_a_login_node_uses_the_given_cluster(tmp_path):
    plan = run_stages(compose(["mode=plan", "cluster=slurm", "cluster.nodes=4", "parallel=ddp", "hardware.gpu=A800"]), tmp_path).to_dict()
    assert plan["world_size"] == 32  # 4 nodes x the default 8 GPUs per node
    assert plan["batch"]["global_batch_size"] == 8 * 32
    assert plan["cluster"] == {"name": "slurm", "nodes": 4, "devices_per_node": 8, "source": "cluster.nodes x cluster.devices (no Slurm job here)"}


def test_plan_inside_a_job_reads_the_allocation(in_job, tmp_path):
    in_job(SRUN_2x4)
    plan = run_stages(compose(["mode=plan", "cluster=slurm", "parallel=ddp"]), tmp_path).to_dict()
    assert plan["world_size"] == 8
    assert plan["cluster"]["source"] == "allocation of Slurm job 4242"


def test_training_config_disagreeing_with_the_job_stops_before_building(in_job):
    in_job(SRUN_2x4)
    validate(compose(["cluster=slurm", "parallel=ddp"]))  # the allocation itself: fine
    with pytest.raises(ConfigError) as e:
        validate(compose(["cluster=slurm", "parallel=ddp", "cluster.devices=8"]))
    assert "cluster.devices=8" in str(e.value) and "4 task(s) per node" in str(e.value)
    # Planning inside a job for another size is fine: only training must match the allocation.
    validate(compose(["mode=plan", "cluster=slurm", "parallel=ddp", "cluster.devices=8"]))


def test_devices_of_cluster_slurm():
    from tinytrain.cluster.slurm import tasks_per_node

    assert tasks_per_node(8, {}) == 8  # a login node: what to plan for
    assert tasks_per_node(8, SRUN_2x4) == 4
    # `sbatch --ntasks=1` (one GPU, no --ntasks-per-node): one task on the node.
    assert tasks_per_node(8, {"SLURM_NTASKS": "1", "SLURM_NNODES": "1"}) == 1


def test_one_task_job_without_tasks_per_node_trains(in_job, tmp_path):
    in_job({"SLURM_JOB_ID": "7", "SLURM_JOB_NAME": "tinytrain", "SLURM_NNODES": "1", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"})
    cfg = compose(["cluster=slurm"])
    assert (cfg.cluster.nodes, cfg.cluster.devices) == (1, 1)
    validate(cfg)

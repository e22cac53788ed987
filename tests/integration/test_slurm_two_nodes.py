"""slurm/multi_node.sbatch on a real two-node Slurm (two slurmd on this machine): 2 nodes x 1 task
train over gloo in one run directory; SIGUSR1 to both tasks checkpoints, the job is requeued, both
nodes resume, and metrics.csv ends as an uninterrupted two-node run's."""

from __future__ import annotations

import pytest

from tests.conftest import REPO
from tests.integration.slurm_jobs import assert_resumed_on_the_same_trajectory, requeue_mid_run

pytestmark = [pytest.mark.slurm, pytest.mark.slow]
SCRIPT = REPO / "slurm" / "multi_node.sbatch"
# The script's nodes and tasks made CPU-sized: one task of one core (and one of the fake GPUs) per
# node. parallel=ddp for its DeepSpeed, which needs CUDA.
TWO_NODES = ["--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=1", "--cpus-per-task=1"]


def launches(slurm, job_id: str) -> dict[str, int]:
    """Per node: how many times its slurmd launched the job's srun step (its log says so)."""
    logs = {node: (slurm.root / "log" / f"slurmd-{node}.log").read_text(errors="replace") for node in slurm.nodes}
    return {node: log.count(f"launch task StepId={job_id}.0 ") for node, log in logs.items()}


def test_two_nodes_train_in_one_run_directory_and_resume_together_after_sigusr1(slurm_two_nodes, tmp_path):
    requeued = requeue_mid_run(slurm_two_nodes, SCRIPT, TWO_NODES, ["parallel=ddp"], tmp_path)
    job_id = requeued.resumed.job.fields["JobId"]
    # Each start ran a task on each node, as one world of 2 with rank 0 at node1's address.
    assert launches(slurm_two_nodes, job_id) == {"node1": 2, "node2": 2}
    for restart in (0, 1):
        assert f"job {job_id} on node[1-2] (rank 0 at 127.0.0.1), restart {restart}," in requeued.resumed.log, requeued.resumed.log[-4000:]
    for start in (requeued.first, requeued.second):
        assert "cluster    slurm: 2 node(s) x 1 device(s) per node, from allocation of Slurm job" in start, start[-4000:]
        assert "world size 2 = tp 1 x dp 2" in start, start[-4000:]
    # One run directory for both nodes and both starts.
    assert [p.name for p in (tmp_path / "interrupted").iterdir() if p.is_dir()] == [f"slurm-{job_id}"]
    assert_resumed_on_the_same_trajectory(requeued)


def test_mode_sbatch_builds_the_store_as_a_two_part_array_then_trains_after_it(slurm_two_nodes, tmp_path):
    """mode=sbatch data.prepare_parts=2: submit.sh sends the prepare array (a part a task) and the
    training job with --dependency=afterok; the tasks build one part each, the last writes the
    manifest, and training starts after both and reuses the parts."""
    import json
    import subprocess

    from tests.conftest import run_cli
    from tests.integration.slurm_jobs import SHORT_RUN, finish, job_env

    shards = tmp_path / "shards"
    shards.mkdir()
    for f in range(4):
        (shards / f"shard-{f}.jsonl").write_text("".join(json.dumps({"text": f"shard {f} document {d}: " + "words and more words " * 8}) + "\n" for d in range(30)))
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    data = ["data=jsonl", f"data.path={shards}", "data.text_field=text", f"data.cache_dir={cache}", "data.prepare_parts=2", "data.tokenize_workers=0"]
    r = run_cli(["mode=sbatch", "cluster=slurm", "cluster.nodes=1", "cluster.devices=1", "cluster.cpus_per_task=1", "parallel=single", *data, *SHORT_RUN], run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert not cache.exists()  # planning built nothing: the array does
    submitted = subprocess.run(["bash", str(run_dir / "submit.sh")], env=slurm_two_nodes.env(job_env()), capture_output=True, text=True, timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    prepare_id, train_id = (int(w) for w in __import__("re").findall(r"job (\d+)", submitted.stdout))
    trained = finish(slurm_two_nodes, train_id, tmp_path, timeout=400, run_dir=run_dir)
    tasks = slurm_two_nodes.jobs(prepare_id)
    assert sorted(t.fields["ArrayTaskId"] for t in tasks) == ["0", "1"] and all(t.state == "COMPLETED" for t in tasks)
    assert trained.job.fields["StartTime"] >= max(t.fields["EndTime"] for t in tasks)  # ISO times: afterok held it
    logs = {t.fields["ArrayTaskId"]: (run_dir / "prepare" / f"slurm-{prepare_id}_{t.fields['ArrayTaskId']}.out").read_text() for t in tasks}
    for part, log in logs.items():
        assert f"part {part} of 2 (2 files: shard-{2 * int(part)}.jsonl .. shard-{2 * int(part) + 1}.jsonl): built" in log, log[-3000:]
    assert sum("complete: all 2 parts built" in log for log in logs.values()) >= 1
    assert "2 parts, reused" in trained.log and "(first step) ->" in trained.log, trained.log[-3000:]
    assert sorted(trained.losses()) == list(range(6))

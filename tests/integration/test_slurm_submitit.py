"""A Hydra multirun of two configs through hydra/launcher=submitit_slurm on a real Slurm."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.integration.slurm_jobs import SHORT_RUN, job_env

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_multirun_of_two_learning_rates(slurm, tmp_path):
    sacct = slurm.sacct_standin(tmp_path / "bin")
    env = slurm.env(job_env())
    env["PATH"] = f"{sacct.parent}{os.pathsep}{env['PATH']}"
    # A fresh submitit folder: job ids start again with every test cluster (at a random number), and
    # submitit would return an old result pickle found under the same id.
    submitit_dir = tmp_path / "submitit"
    cmd = [
        sys.executable, "-m", "tinytrain", "-m",
        "hydra/launcher=submitit_slurm", "hydra.launcher.partition=debug", "hydra.launcher.timeout_min=10",
        f"hydra.launcher.submitit_folder={submitit_dir}/%j",
        "cluster=slurm", "trainer.lr=0.001,0.002", *SHORT_RUN,
        f"run.root={tmp_path}", "run.name=grid",
    ]  # fmt: skip
    r = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(submitit_dir.rglob("*_log.*")))
    assert r.returncode == 0, f"{r.stdout[-3000:]}\n{r.stderr[-3000:]}\n{logs}"

    # The command returns once both results are written; the jobs themselves still have to exit.
    jobs = [j for j in slurm.wait_all(timeout=60) if j.fields.get("StdOut", "").startswith(str(submitit_dir))]
    assert [j.state for j in jobs] == ["COMPLETED", "COMPLETED"], [j.fields for j in jobs]

    # Each job's return value is tinytrain's: the final validation loss.
    results = {}
    for path in submitit_dir.rglob("*_result.pkl"):
        status, job_return = pickle.loads(path.read_bytes())
        assert status == "success", job_return
        results[next(o for o in job_return.overrides if o.startswith("trainer.lr="))] = job_return.return_value
    assert set(results) == {"trainer.lr=0.001", "trainer.lr=0.002"}
    assert all(isinstance(v, float) and 0 < v < 20 for v in results.values()), results
    assert results["trainer.lr=0.001"] != results["trainer.lr=0.002"]
    for num in ("0", "1"):
        run_dir = tmp_path / "multirun" / "grid" / num
        assert (run_dir / "metrics.csv").exists() and (run_dir / "checkpoints" / "final.ckpt").exists()
        result = json.loads((run_dir / "result.json").read_text())  # written inside the Slurm job
        assert result["status"] == "completed" and result["val_loss"] == results[next(o for o in result["overrides"] if o.startswith("trainer.lr="))]
    assert "jobs best first" in r.stdout
    # Each job's whole log (the plan is printed before the training lines the tail above shows).
    whole = "\n".join(p.read_text(errors="replace") for p in sorted(submitit_dir.rglob("*_log.*")))
    assert whole.count("cluster    slurm: 1 node(s) x 1 device(s) per node, from allocation of Slurm job") == 2

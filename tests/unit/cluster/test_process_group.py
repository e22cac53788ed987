"""A run's process group is destroyed when the run ends normally (tinytrain/cluster/process_group.py):
left to interpreter exit, Gloo's threads can abort a finished run with SIGABRT."""

import os

import pytest
import torch.distributed as dist

from tinytrain.cluster import process_group


def test_a_run_that_made_a_group_destroys_it_and_one_that_did_not_is_left_alone(tmp_path):
    assert not dist.is_initialized() and process_group.release() is False
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        assert process_group.release() is True
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


GROUP_THREADS_AFTER_RELEASE = """
import os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from tinytrain.cluster import process_group
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tensor_parallel",))
x = distribute_tensor(torch.randn(8, 8), mesh, [Shard(0)])
(x @ x.T).redistribute(mesh, [Replicate()]).to_local().sum()
del x, mesh
process_group.release()
print(sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")))
"""


def test_after_a_dtensor_run_the_groups_and_gloo_s_threads_end_at_release(tmp_path):
    """DTensor's caches hold the meshes they saw and a mesh its groups: destroyed but still held, a
    group's gloo threads ran into the interpreter's exit (seen after a 2-rank fsdp_tp run). release()
    clears the caches, so the groups end there."""
    import subprocess
    import sys

    if not os.path.isdir("/proc/self/task"):
        pytest.skip("reads the threads from /proc")
    out = subprocess.run([sys.executable, "-c", GROUP_THREADS_AFTER_RELEASE, str(tmp_path / "store")], capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    threads = out.stdout.strip().splitlines()[-1]
    assert "gloo" not in threads, threads

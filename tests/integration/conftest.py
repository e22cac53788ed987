"""The real Slurm clusters the slurm-marked tests submit to: started once per test session (the
two-node one once per module that uses it), stopped after."""

from __future__ import annotations

import pytest

from tests.slurm_cluster import SlurmCluster, cannot_run_reason


def running_cluster(tmp_path_factory, nodes: int):
    reason = cannot_run_reason()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp(f"slurm{nodes}"), nodes=nodes)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    yield from running_cluster(tmp_path_factory, nodes=1)


@pytest.fixture(scope="module")
def slurm_two_nodes(tmp_path_factory):
    """Two nodes (node1, node2) of one machine, each with its own slurmd."""
    yield from running_cluster(tmp_path_factory, nodes=2)

"""The real Slurm the slurm-marked tests submit to: started once per test session, stopped after."""

from __future__ import annotations

import pytest

from tests.slurm_cluster import SlurmCluster, cannot_run_reason


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    reason = cannot_run_reason()
    if reason:
        pytest.skip(reason)
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

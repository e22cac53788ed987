"""The real Slurm the slurm-marked tests submit to: started once per test session, stopped after."""

from __future__ import annotations

import pytest

from tests.slurm_cluster import APT_INSTALL, SlurmCluster, missing_binaries


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    missing = missing_binaries()
    if missing:
        pytest.skip(f"Slurm is not installed ({', '.join(missing)} not found); as root: {APT_INSTALL} (.ci/run does it)")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()

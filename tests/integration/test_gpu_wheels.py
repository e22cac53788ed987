"""benchmarks/gpu_wheels.sh fills a folder that makes a bare GPU image complete: a fresh venv that
holds only what the image has (torch, transformers, lightning, peft, tensorboard and what they
require, linked from this venv through a .pth) plus the folder, installed by gpu_check.sh itself
with `pip install --no-index --no-deps --target`, imports every module gpu_check needs and runs
`gpu_check.sh --part a --dry-run`.

The image runs CPython 3.12 and this test machine 3.11: the folder is built by the same script with
`--python-version` of this interpreter (binary wheels such as pydantic_core and msgpack differ only
in their tag; the list of packages is the same). Needs PyPI (skipped without it, saying so)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import socket
import subprocess
import sys
import venv
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO

pytestmark = pytest.mark.slow

IMAGE = ("torch", "transformers", "lightning", "peft", "tensorboard")  # the GPU image's Python packages
GPU_CHECK_IMPORTS = ["hydra", "omegaconf", "antlr4", "hydra_plugins.hydra_submitit_launcher.submitit_launcher", "submitit", "deepspeed", "deepspeed.runtime.zero.stage3", "tinytrain.cli", "tinytrain.train.fit", "tinytrain.model.varlen_attention", "lightning.pytorch.strategies.deepspeed"]


def pypi_reachable() -> bool:
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def closure(names) -> set[str]:
    """The installed distributions `names` need, with their requirements (and the extras they ask for)."""
    seen, todo = set(), [(n, frozenset()) for n in names]
    while todo:
        name, extras = todo.pop()
        key = (canonicalize_name(name), extras)
        if key in seen:
            continue
        seen.add(key)
        dist = importlib.metadata.distribution(name)
        for line in dist.requires or []:
            req = Requirement(line)
            wanted = [{**default_environment(), "extra": e} for e in (extras or {""})]
            if req.marker is None or any(req.marker.evaluate(env) for env in wanted):
                try:
                    importlib.metadata.distribution(req.name)
                except importlib.metadata.PackageNotFoundError:
                    continue  # not installed here: not on the image either (an optional backend)
                todo.append((req.name, frozenset(req.extras)))
    return {name for name, _ in seen}


def link_image(into: Path) -> None:
    """Symlinks to the image's distributions only (their modules and metadata), from this venv."""
    into.mkdir()
    for name in closure(IMAGE):
        dist = importlib.metadata.distribution(name)
        for top in {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}:
            target = Path(dist.locate_file(top))
            if target.exists() and not (into / top).exists():
                (into / top).symlink_to(target)


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    if not pypi_reachable():
        pytest.skip("needs PyPI (pypi.org:443 unreachable): benchmarks/gpu_wheels.sh downloads the wheels from there")
    folder = tmp_path_factory.mktemp("wheels")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    result = subprocess.run(["bash", "benchmarks/gpu_wheels.sh", str(folder), "--python-version", version], cwd=REPO, env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "MiB (limit 40 MiB)" in result.stdout
    return folder


def test_the_wheel_folder_completes_a_bare_image(wheels, tmp_path):
    env_dir = tmp_path / "image"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    link_image(tmp_path / "image_packages")
    site = next((env_dir / "lib").glob("python*/site-packages"))
    (site / "image.pth").write_text(str(tmp_path / "image_packages") + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    bare = subprocess.run([str(python), "-c", "import torch, transformers, lightning, peft; import hydra"], env=env, capture_output=True, text=True)
    assert "No module named 'hydra'" in bare.stderr, bare.stderr[-2000:]  # the image alone lacks what the folder brings

    out, site_dir = tmp_path / "results", tmp_path / "site"
    env = {**env, "PYTHON": str(python), "GPU_CHECK_SITE": str(site_dir), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(["bash", "benchmarks/gpu_check.sh", "--part", "a", "--out", str(out), "--dry-run", "--wheels", str(wheels)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((out / "gpu_check.json").read_text())
    assert list(results["parts"]) == ["a"] and results["parts"]["a"]["device"] == "CPU (dry run)"
    rows = {r["check"]: r for r in results["rows"]}
    assert {check: r["status"] for check, r in rows.items()} == {"packed isolation varlen": "ok", "packed isolation sdpa": "ok", "train single_fp32": "ok"}, rows
    assert "torch_varlen_reference (cpu reference)" in rows["packed isolation varlen"]["note"] and "mistral micro4" in rows["packed isolation varlen"]["note"]
    assert "export reloads" in rows["train single_fp32"]["note"] and rows["train single_fp32"]["plan GiB"]
    assert (out / "gpu_check.md").read_text().count("\n| a | ") == 3

    imports = "; ".join(f"import {m}" for m in GPU_CHECK_IMPORTS)
    check = f"{imports}; import importlib.metadata as m; print(m.version('liger-kernel'), m.version('deepspeed'))"
    imported = subprocess.run([str(python), "-c", check], cwd=REPO, env={**env, "PYTHONPATH": f"{site_dir}:{REPO}"}, capture_output=True, text=True, timeout=300)
    assert imported.returncode == 0, imported.stderr[-3000:]
    assert imported.stdout.split()[-2:] == ["0.8.5", "0.19.8"]  # after DeepSpeed's own log lines

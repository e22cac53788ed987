"""The wheel works where tinytrain is installed rather than checked out: built with pip, installed
into a fresh venv where the checkout is not importable, and run from an empty directory through
the `tinytrain` console script (help, version, a plan, a user config folder on top, a 3-step run).

The fresh venv gets the wheel's core dependencies (its Requires-Dist, no extras, and what they
require in turn) from this environment, the versions the tests run with: a folder of links to
exactly those distributions, named in a .pth file. pip then installs the wheel with --no-index, so
it must find every declared dependency satisfied there (installing the 1.6 GB stack again would
take minutes). The extras (deepspeed, wandb, tensorboard) are left out, so the runs also show that
the core alone plans and trains, and that asking for an extra says which one to install.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from importlib.metadata import distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def wheel_requirements(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as z:
        metadata = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(metadata).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def core_closure(requirements: list[str]) -> dict:
    """The installed distributions the requirements reach (the wheel's own extras left out; a
    dependency's extras, such as fsspec[http], followed), by canonical name."""
    found, followed = {}, set()
    todo = [(r, "") for r in requirements]
    while todo:
        line, extra = todo.pop()
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": extra}):
            continue
        name = canonicalize_name(req.name)
        found.setdefault(name, distribution(req.name))
        for wanted in ("", *req.extras):
            if (name, wanted) not in followed:
                followed.add((name, wanted))
                todo += [(r, wanted) for r in found[name].requires or []]
    return found


def link_distributions(dists, site_packages: Path, folder: Path) -> None:
    """A folder of links to the top-level entries (packages, modules, .dist-info, .libs) of `dists`."""
    folder.mkdir()
    for dist in dists:
        for entry in {f.parts[0] for f in dist.files or []}:
            if entry in ("..", "__pycache__") or entry.endswith(".pth") or (folder / entry).exists():
                continue
            (folder / entry).symlink_to(site_packages / entry)


def run(cmd: list, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "HYDRA_FULL_ERROR", "TINYTRAIN_TRACEBACK")}
    return subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the fresh venv's bin folder, an empty working directory)."""
    root = tmp_path_factory.mktemp("wheel")
    # Built from a copy of what the wheel is made of: setuptools leaves build/ and *.egg-info in the source tree.
    source = root / "source"
    shutil.copytree(REPO / "tinytrain", source / "tinytrain", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    # This environment has the build backend (setuptools, which torch requires): no isolated build env.
    built = run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", root / "dist", source], root)
    assert built.returncode == 0, built.stderr[-3000:]
    from tinytrain import __version__

    (wheel,) = (root / "dist").glob(f"tinytrain_llm-{__version__}-*.whl")
    venv = root / "venv"
    # Without pip (and Python 3.11's old setuptools): this environment's pip installs into it (--python).
    assert run([sys.executable, "-m", "venv", "--without-pip", venv], root).returncode == 0
    fresh_site = Path(run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], root).stdout.strip())
    core = core_closure(wheel_requirements(wheel))
    assert "deepspeed" not in core and "wandb" not in core and "tensorboard" not in core
    link_distributions(core.values(), Path(sysconfig.get_path("purelib")), root / "core_dependencies")
    (fresh_site / "tested_dependencies.pth").write_text(f"{root / 'core_dependencies'}\n")
    pip = run([sys.executable, "-m", "pip", "--python", venv / "bin" / "python", "install", "-q", "--no-index", "--no-cache-dir", "-c", REPO / "constraints-cpu.txt", wheel], root)
    assert pip.returncode == 0, pip.stdout[-3000:] + pip.stderr[-3000:]
    work = root / "empty"
    work.mkdir()
    return venv / "bin", work


def test_the_checkout_is_not_what_runs(installed):
    bin_dir, work = installed
    r = run([bin_dir / "python", "-c", "import tinytrain, importlib.util; print(tinytrain.__file__); print(importlib.util.find_spec('deepspeed'))"], work)
    where, deepspeed = r.stdout.split()
    assert Path(where).is_relative_to(bin_dir.parent) and not Path(where).is_relative_to(REPO), where
    assert deepspeed == "None"  # only the core is installed


def test_version_and_help(installed):
    bin_dir, work = installed
    from tinytrain import __version__

    r = run([bin_dir / "tinytrain", "--version"], work)
    assert (r.returncode, r.stdout.strip()) == (0, f"tinytrain {__version__}")
    r = run([bin_dir / "tinytrain", "--help"], work)
    assert r.returncode == 0, r.stderr
    assert "modes (mode=...)" in r.stdout and re.search(r"model\s+.*\[tiny\]", r.stdout) and "schema/" not in r.stdout


def test_plan_from_an_empty_directory_with_a_user_config_folder(installed):
    """The shipped configs come from the package; a folder of the user's composes on top."""
    bin_dir, work = installed
    mine = work / "my_conf" / "model"
    mine.mkdir(parents=True)
    (mine / "wide.yaml").write_text("name: wide\nhidden_size: 256\nnum_heads: 8\n")
    r = run([bin_dir / "tinytrain", "--config-dir", work / "my_conf", "model=wide", "mode=plan", "run.name=plan"], work)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    resolved = (work / "runs" / "plan" / "config_resolved.yaml").read_text()
    assert "name: wide" in resolved and "hidden_size: 256" in resolved and str(bin_dir.parent) in resolved  # the bundled tokenizer: the installed package's
    assert (work / "runs" / "plan" / "plan.json").exists()


def test_a_missing_extra_is_named(installed):
    bin_dir, work = installed
    r = run([bin_dir / "tinytrain", "mode=plan", "run.name=zero2", "parallel=zero2", "logger=tensorboard"], work)
    assert r.returncode == 2, r.stderr[-3000:]
    assert "pip install 'tinytrain-llm[deepspeed]'" in r.stderr and "pip install 'tinytrain-llm[tensorboard]'" in r.stderr


def test_three_step_training_run(installed):
    bin_dir, work = installed
    r = run([bin_dir / "python", "-m", "tinytrain", "experiment=smoke", "trainer.max_steps=3", "trainer.warmup_steps=1", "trainer.val_every_n_steps=3", "trainer.plot=false", "data.tokenize_workers=0", "run.name=train"], work)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "loss " in r.stdout and (work / "runs" / "train" / "checkpoints" / "final.ckpt").exists()

"""pyproject.toml declares what tinytrain imports, and the version has one source."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import REPO

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def imported_modules() -> dict[str, str]:
    """Top-level modules imported anywhere in tinytrain/ (at module level or inside functions),
    or probed with find_spec("..."), each with one file that imports it."""
    found = {}
    for path in sorted((REPO / "tinytrain").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "find_spec" and node.args and isinstance(node.args[0], ast.Constant):
                names = [node.args[0].value]
            for name in names:
                found.setdefault(name.split(".")[0], str(path.relative_to(REPO)))
    return {m: f for m, f in found.items() if m not in sys.stdlib_module_names and m != "tinytrain"}


def declared() -> dict[str, str]:
    """Every distribution pyproject.toml declares, with where: the core or the extra."""
    names = {canonicalize_name(Requirement(r).name): "core" for r in PROJECT["dependencies"]}
    for extra, reqs in PROJECT["optional-dependencies"].items():
        for r in reqs:
            names.setdefault(canonicalize_name(Requirement(r).name), extra)
    return names


def test_every_imported_package_is_declared():
    providers = importlib.metadata.packages_distributions()
    known = declared()
    undeclared = []
    for module, where in imported_modules().items():
        # Not installed here (the gpu and eval extras): the distribution is named after the module.
        dists = providers.get(module, [module.replace("_", "-")])
        if not any(canonicalize_name(d) in known for d in dists):
            undeclared.append(f"{module} ({' / '.join(dists)}, imported by {where})")
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"


def test_extras_hold_the_optional_stacks():
    known = declared()
    assert {k: known[k] for k in ("deepspeed", "wandb", "tensorboard", "peft", "flash-attn", "liger-kernel")} == {
        "deepspeed": "deepspeed",
        "wandb": "wandb",
        "tensorboard": "tensorboard",
        "peft": "lora",
        "flash-attn": "flash-attn",  # its own extra: `gpu` must install from wheels (no CUDA build)
        "liger-kernel": "gpu",
    }
    assert PROJECT["optional-dependencies"]["gpu"] == ["liger-kernel>=0.8"]
    # make setup installs .[dev]: every extra that runs on a CPU comes with it.
    assert "tinytrain-llm[deepspeed,wandb,tensorboard,lora,fp8,eval,docs]" in PROJECT["optional-dependencies"]["dev"]


def test_dependencies_are_ranges_and_constraints_pin_them():
    """pyproject says what tinytrain needs (no exact pins that would replace a cluster's torch);
    constraints-cpu.txt pins every one to the version CI tested."""
    pins = dict(line.split("==", 1) for line in (REPO / "constraints-cpu.txt").read_text().splitlines() if "==" in line and not line.startswith("#"))
    pins = {canonicalize_name(k): v for k, v in pins.items()}
    for req in PROJECT["dependencies"] + [r for e, rs in PROJECT["optional-dependencies"].items() if e in ("deepspeed", "wandb", "tensorboard") for r in rs]:
        r = Requirement(req)
        assert not any(s.operator == "==" for s in r.specifier), f"{req}: an exact pin in pyproject.toml"
        assert canonicalize_name(r.name) in pins, f"{r.name} is not pinned in constraints-cpu.txt"
        assert r.specifier.contains(pins[canonicalize_name(r.name)].split("+")[0], prereleases=True), f"{req} excludes the tested {pins[canonicalize_name(r.name)]}"


def test_one_source_for_the_version():
    import tinytrain

    # The wheel's version (and `tinytrain --version`) is read from tinytrain/__init__.py: tests/integration/test_wheel.py.
    assert PROJECT["dynamic"] == ["version"] and "version" not in PROJECT
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "tinytrain.__version__"}
    assert re.search(rf"^## {re.escape(tinytrain.__version__)}\b", (REPO / "CHANGELOG.md").read_text(), re.M)


def test_the_gpu_wheel_list_pins_what_ci_tested():
    """benchmarks/gpu_wheels.txt (the wheels a bare GPU image needs) pins each package as constraints-cpu.txt does."""
    pins = {canonicalize_name(k): v for k, v in (line.split("==", 1) for line in (REPO / "constraints-cpu.txt").read_text().splitlines() if "==" in line and not line.startswith("#"))}
    wheels = [Requirement(line) for line in (REPO / "benchmarks" / "gpu_wheels.txt").read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert {"hydra-core", "omegaconf", "antlr4-python3-runtime", "deepspeed", "liger-kernel", "submitit", "hydra-submitit-launcher"} <= {canonicalize_name(r.name) for r in wheels}
    for r in wheels:
        if canonicalize_name(r.name) in pins:
            assert str(r.specifier) == f"=={pins[canonicalize_name(r.name)]}", f"{r}: constraints-cpu.txt pins {pins[canonicalize_name(r.name)]}"
        else:
            assert canonicalize_name(r.name) == "liger-kernel", f"{r.name} is not pinned in constraints-cpu.txt"

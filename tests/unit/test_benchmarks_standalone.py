"""Benchmarks run as scripts from a checkout (`python benchmarks/<name>.py`): none may import the
tests package, which is importable only with the repository on PYTHONPATH."""

import ast
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_no_benchmark_imports_the_tests_package():
    offenders = {p.name: sorted(m for m in imported_modules(p) if m == "tests" or m.startswith("tests.")) for p in sorted(BENCHMARKS.glob("*.py"))}
    assert {name: mods for name, mods in offenders.items() if mods} == {}

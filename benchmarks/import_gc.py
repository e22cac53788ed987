"""What pausing the cyclic collector saves while tinytrain imports its stack (tinytrain/cluster/import_gc.py):
the modules `python -m tinytrain` imports before training (cli.run_stages' `with collector_paused()` blocks, read from its source),
each side in a fresh interpreter, plain imports vs the same inside `collector_paused()`, alternating
plain / paused in each round; the time of the imports (from inside the interpreter, so the
interpreter's own start is left out) and the collector's runs during them.

    python benchmarks/import_gc.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SIDE = """
import gc, json, time
start = time.perf_counter()
import tinytrain.cli
from tinytrain.cluster.import_gc import collector_paused
exec({code!r})
print(json.dumps({{"s": time.perf_counter() - start, "collections": sum(s["collections"] for s in gc.get_stats())}}))
"""


def paused_blocks() -> list[ast.With]:
    """The `with collector_paused():` blocks of cli.run_stages, read from its source (so the
    benchmark imports what the command imports)."""
    tree = ast.parse((REPO / "tinytrain" / "cli.py").read_text())
    run_stages = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "run_stages")
    return [n for n in ast.walk(run_stages) if isinstance(n, ast.With) and ast.unparse(n.items[0].context_expr) == "collector_paused()"]


def side(paused: bool) -> dict:
    blocks = paused_blocks()
    code = "\n".join(ast.unparse(block if paused else block.body) for block in blocks)
    out = subprocess.run([sys.executable, "-c", SIDE.format(code=code)], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    rounds = parser.parse_args().rounds
    runs = {False: [], True: []}
    for _ in range(rounds):
        for paused in (False, True):
            runs[paused].append(side(paused))
    plain, paused = (statistics.median(r["s"] for r in runs[p]) for p in (False, True))
    collections = {p: runs[p][0]["collections"] for p in runs}
    print(f"tinytrain's imports before training: plain {plain:.2f} s ({collections[False]} collections), collector paused {paused:.2f} s ({collections[True]}); medians of {rounds}, ratio {paused / plain:.2f}")


if __name__ == "__main__":
    main()

"""How far one change travels: counts for issue 27's three axes, on a tinytrain tree.

- files outside the strategy table that compare strategy names (`Strategy.<member>`, or a
  `...strategy...` expression compared with a strategy's name): the files a new strategy touches;
- files that decide a checkpoint's on-disk format from its path (a recogniser such as `is_sharded`,
  or `.is_dir()` on a checkpoint path) where issue 32 wants only the format table
  (checkpoint/formats.py) to: the files a new format touches;
- plan/validate.py's lines;
- the files the raw config reaches after planning: a default `experiment=smoke` training run
  in-process, every read of the OmegaConf config after make_plan returned attributed to the first
  tinytrain frame on the stack (the plan is built; what still reads `cfg` then is a second source).

`python benchmarks/axes_of_change.py [--root <a tinytrain checkout>]` (default: this one). Run on
the commit before the change with `git worktree add /tmp/before <commit>` and `--root /tmp/before`.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
from pathlib import Path

NAMES = {"single", "ddp", "deepspeed", "fsdp_tp"}
TABLE = {"plan/parallel.py", "train/strategy.py", "config/schema.py"}  # the table, its Lightning builders, the enum

# Recognisers of a format from its path; `.is_dir()` on a path-like expression decides one too.
RECOGNISERS = {"is_sharded", "is_deepspeed_folder", "deepspeed_state_file", "DEEPSPEED_STATE_FILES", "is_sharded_folder"}
PATHLIKE = ("path", "ckpt", "checkpoint")

TRACE = r"""
import sys, threading
from pathlib import Path
import tinytrain.plan.planner as planner
import tinytrain.cli as cli
PKG = str(Path(cli.__file__).resolve().parent)
reached = set()
def hook(frame, event, arg):
    if event != "call" or "/omegaconf/" not in frame.f_code.co_filename:
        return
    f = frame.f_back
    while f is not None:
        name = f.f_code.co_filename
        if name.startswith(PKG):
            reached.add(str(Path(name).relative_to(PKG)))
            return
        if "/omegaconf/" not in name:
            f = f.f_back
            continue
        f = f.f_back
original = planner.make_plan
def traced(*args, **kwargs):
    plan = original(*args, **kwargs)
    sys.setprofile(hook)
    threading.setprofile(hook)
    return plan
planner.make_plan = traced
sys.argv = ["tinytrain", *sys.argv[1:]]
try:
    cli.main()
finally:
    sys.setprofile(None)
    print("REACHED " + " ".join(sorted(reached)))
"""


def strategy_branches(path: Path) -> int:
    count = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Strategy" and node.attr in NAMES:
            count += 1
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(s, ast.Constant) and s.value in NAMES for s in sides) and any("strategy" in ast.unparse(s) for s in sides):
                count += 1
    return count


def is_pathlike(text: str) -> bool:
    """A checkpoint's path (not a folder of them: `checkpoint_dir.is_dir()` decides no format)."""
    return any(w in text for w in PATHLIKE) and "dir" not in text


def format_decisions(path: Path) -> int:
    """Recognisers named (imported, called or defined; not other libraries' attributes of that name) and `<path>.is_dir()` calls in one file."""
    count = 0
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Name) and node.id in RECOGNISERS or isinstance(node, (ast.FunctionDef, ast.alias)) and node.name in RECOGNISERS:
            count += 1
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "is_dir" and is_pathlike(ast.unparse(node.func.value)):
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    args = parser.parse_args()
    package = args.root / "tinytrain"
    branching = {p.relative_to(package).as_posix(): n for p in sorted(package.rglob("*.py")) if (n := strategy_branches(p))}
    outside = {k: v for k, v in branching.items() if k not in TABLE}
    deciding = {p.relative_to(package).as_posix(): n for p in sorted(package.rglob("*.py")) if (n := format_decisions(p))}
    validate_lines = len((package / "plan" / "validate.py").read_text().splitlines())
    with tempfile.TemporaryDirectory() as tmp:
        run = subprocess.run(
            [sys.executable, "-c", TRACE, "experiment=smoke", "trainer.progress_bar=false", f"hydra.run.dir={tmp}/run"],
            cwd=args.root,
            env={"PYTHONPATH": str(args.root), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"},
            capture_output=True,
            text=True,
        )
    line = next((ln for ln in run.stdout.splitlines() if ln.startswith("REACHED")), None)
    if run.returncode or line is None:
        sys.exit(f"the traced run failed:\n{run.stderr[-3000:]}")
    reached = line.split()[1:]
    print(json.dumps({"strategy_branches_outside_the_table": outside, "format_decisions_from_a_path": deciding, "validate_py_lines": validate_lines, "raw_config_after_planning": reached}, indent=2))
    print(f"files comparing strategy names outside the table: {len(outside)}; files deciding a checkpoint format from its path: {len(deciding)}; plan/validate.py: {validate_lines} lines; files reading the raw config after planning: {len(reached)}")


if __name__ == "__main__":
    main()

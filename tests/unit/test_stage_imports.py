"""The package's folders follow the run's stages, and no module imports from a later stage.

Stages in order (docs/architecture.md, "Layout"); a module may import its own stage and earlier ones, anywhere in
the file (imports inside functions count too). `tinytrain/errors.py` is shared by all.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "tinytrain"
STAGES = ["cluster", "config", "data", "checkpoint", "preflight", "plan", "model", "train", "outputs", "cli"]
SHARED = {"errors", "__init__"}
# Up to the plan, nothing may pull the training stack in at import time: `mode=plan` on a login
# node imports these (tests/unit/plan/test_model_shape.py checks the modules a real plan loads).
PLANNING_STAGES = STAGES[: STAGES.index("plan") + 1]
TRAINING_STACK = ("lightning", "deepspeed", "wandb", "transformers.models", "transformers.modeling_utils")


def stage_of(module: str) -> str | None:
    """`tinytrain.plan.vocab` -> "plan"; top-level `tinytrain.cli` / `__main__` -> "cli"."""
    parts = module.split(".")
    if parts[0] != "tinytrain" or len(parts) == 1:
        return None
    head = parts[1]
    if head in SHARED:
        return None
    if head in ("cli", "__main__"):
        return "cli"
    return head


def modules() -> list[tuple[str, Path]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        dotted = ".".join(("tinytrain", *path.relative_to(PACKAGE).with_suffix("").parts))
        found.append((dotted.removesuffix(".__init__"), path))
    return found


def imports(path: Path, module: str) -> list[tuple[int, str, bool]]:
    """(line, imported module, at module level) for every import in the file."""
    tree = ast.parse(path.read_text())
    top = {id(node) for node in tree.body}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from . import x
                package = module.split(".")[: -node.level] if not path.name == "__init__.py" else module.split(".")[: len(module.split(".")) - node.level + 1]
                base = ".".join([*package, base] if base else package)
            out.append((node.lineno, base, id(node) in top))
            out += [(node.lineno, f"{base}.{alias.name}", id(node) in top) for alias in node.names]
    return out


def test_every_module_sits_in_a_stage_folder():
    loose = [m for m, _ in modules() if stage_of(m) is None and m.split(".")[-1] not in SHARED and m != "tinytrain"]
    assert loose == []
    unknown = sorted({stage_of(m) for m, _ in modules()} - set(STAGES) - {None})
    assert unknown == [], f"stage folders missing from STAGES (and docs/architecture.md): {unknown}"


@pytest.mark.parametrize("module,path", modules(), ids=lambda x: x if isinstance(x, str) else "")
def test_no_module_imports_a_later_stage(module, path):
    mine = stage_of(module)
    if mine is None:
        return
    later = []
    for line, target, _ in imports(path, module):
        theirs = stage_of(target)
        if theirs is not None and theirs in STAGES and STAGES.index(theirs) > STAGES.index(mine):
            later.append(f"line {line}: {target} ({theirs})")
    assert later == [], f"{module} ({mine}) imports from a later stage: {later}"


@pytest.mark.parametrize("module,path", [(m, p) for m, p in modules() if stage_of(m) in PLANNING_STAGES], ids=lambda x: x if isinstance(x, str) else "")
def test_planning_stages_import_no_training_stack_at_module_level(module, path):
    heavy = [f"line {line}: {target}" for line, target, top in imports(path, module) if top and target.startswith(TRAINING_STACK)]
    assert heavy == [], f"{module} imports the training stack when imported: {heavy}"


def test_the_check_sees_a_violation(tmp_path):
    """The test above can fail: a plan module importing the trainer is caught."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from tinytrain.train.trainer import build_trainer\n")
    found = [t for _, t, _ in imports(bad, "tinytrain.plan.bad") if stage_of(t) == "train"]
    assert found == ["tinytrain.train.trainer", "tinytrain.train.trainer.build_trainer"]

"""The strategy table (plan/parallel.py) is the one place that knows a strategy: every strategy has
a row and a Lightning builder, no other module compares strategy names, and what a row says is
what the planner, the checks and the fast paths do."""

import ast
import dataclasses
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import CONF_DIR, compose
from tinytrain.config.schema import Strategy
from tinytrain.errors import ConfigError
from tinytrain.plan import parallel
from tinytrain.plan.fast_paths import select_fast_paths
from tinytrain.plan.validate import validate

PACKAGE = Path(parallel.__file__).resolve().parents[1]
# The table, the Lightning builders beside it, and the enum itself.
OWNERS = {"plan/parallel.py", "train/strategy.py", "config/schema.py"}
NAMES = {s.value for s in Strategy}


def strategy_name_comparisons(path: Path) -> list[str]:
    """`Strategy.<member>` anywhere, and comparisons of a `...strategy...` expression with a name string."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "Strategy" and node.attr in NAMES:
            found.append(f"line {node.lineno}: Strategy.{node.attr}")
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            names = [s.value for s in sides if isinstance(s, ast.Constant) and s.value in NAMES]
            if names and any("strategy" in ast.unparse(s) for s in sides):
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_every_strategy_has_a_row_a_builder_and_a_preset():
    from tinytrain.train.strategy import BUILDERS

    presets = {OmegaConf.load(p).strategy for p in (CONF_DIR / "parallel").glob("*.yaml")}
    assert set(parallel.STRATEGIES) == set(Strategy) == set(BUILDERS)
    assert presets == NAMES
    assert all(row.strategy is s for s, row in parallel.STRATEGIES.items())
    for row in parallel.STRATEGIES.values():
        assert row.checkpoint_format in row.resumable_from  # a run resumes its own checkpoints


def test_no_module_outside_the_table_compares_strategy_names():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).as_posix()
        if rel not in OWNERS and (found := strategy_name_comparisons(path)):
            offenders[rel] = found
    assert offenders == {}


def test_the_scan_sees_a_comparison(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f(plan):\n    return plan.parallel.strategy == 'fsdp_tp' or x is Strategy.ddp\n")
    assert len(strategy_name_comparisons(bad)) == 2


def test_a_row_is_what_the_other_stages_see(monkeypatch):
    """Changing ddp's row changes validation, fine-tuning checks and fast paths: they ask the table."""
    ddp = parallel.STRATEGIES[Strategy.ddp]
    changed = dataclasses.replace(ddp, tensor_parallel=True, fused_adamw=False, liger_off="ddp-x: not checked", lora_off="ddp-x shards the projections", qlora=False)
    monkeypatch.setitem(parallel.STRATEGIES, Strategy.ddp, changed)
    trainer = compose([]).trainer
    fast = select_fast_paths(trainer, Strategy.ddp, on_gpu=True, padded_vocab=4096, liger_available=True)
    assert not fast.fused_adamw and fast.reasons["liger"] == "off: ddp-x: not checked"
    validate(compose(["mode=plan", "parallel=ddp", "parallel.tp=2", "cluster.devices=2"]))  # tp > 1 now allowed
    with pytest.raises(ConfigError) as e:
        validate(compose(["mode=plan", "parallel=ddp", "finetune=lora", "model.pretrained=null", "checkpoint.init_from=null"]))
    assert "finetune=lora: ddp-x shards the projections" in str(e.value)
    monkeypatch.setitem(parallel.STRATEGIES, Strategy.ddp, ddp)
    validate(compose(["mode=plan", "parallel=ddp", "cluster.devices=2"]))
    with pytest.raises(ConfigError, match="has no tensor parallelism"):
        validate(compose(["mode=plan", "parallel=ddp", "parallel.tp=2", "cluster.devices=2"]))

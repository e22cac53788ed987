"""The collector is paused while tinytrain imports its stack, and what was built then is frozen out
of later collections (tinytrain/cluster/import_gc.py; `python benchmarks/import_gc.py` measures it)."""

import gc

from tests.conftest import plan
from tinytrain.cluster.import_gc import collector_paused


def test_paused_inside_then_enabled_with_what_was_built_frozen():
    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    with collector_paused():
        assert not gc.isenabled()
        built = [[i] for i in range(1000)]
    assert gc.isenabled() and gc.get_freeze_count() >= frozen + len(built)


def test_a_collector_the_caller_had_disabled_stays_disabled():
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_a_plan_imports_its_stack_with_the_collector_paused(tmp_path):
    frozen = gc.get_freeze_count()
    plan([], tmp_path / "run")
    assert gc.isenabled() and gc.get_freeze_count() > frozen

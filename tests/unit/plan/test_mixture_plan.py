"""The plan of a weighted mixture: each source's share, one pass's tokens and items, what the run
draws from it and how many passes that is, in plan.json and the printed table."""

import json

import pytest

from tests.conftest import compose
from tinytrain.cli import run_stages
from tinytrain.data.datamodule import MixturePart
from tinytrain.plan.mixture import plan_mixture


def test_expected_draws_passes_and_the_step_a_source_runs_out():
    parts = [MixturePart("big", "text:big.txt", 3.0, 1000, "windows", 64000), MixturePart("small", "text:small.txt", 1.0, 50, "windows", 3200)]
    plan = plan_mixture(parts, exhaustion="repeat", global_batch_size=8, max_steps=100)
    big, small = plan.sources
    assert (big.share, small.share) == (0.75, 0.25)
    assert (big.drawn_items, small.drawn_items) == (600.0, 200.0)  # share x 8 sequences x 100 steps
    assert (big.passes, small.passes) == (0.6, 4.0)
    assert (big.runs_out_step, small.runs_out_step) == (None, 25)  # 50 items at 2 a step
    assert plan.stop_step is None
    # data.exhaustion=stop ends the run at step 25: its draws are those of 25 steps (the table said
    # 4.00 passes under a header saying no source repeats).
    stopped = plan_mixture(parts, exhaustion="stop", global_batch_size=8, max_steps=100)
    big, small = stopped.sources
    assert stopped.stop_step == 25 and (big.drawn_items, small.drawn_items) == (150.0, 50.0) and (big.passes, small.passes) == (0.15, 1.0)


def test_mode_plan_prints_the_mixture_table_and_writes_it_to_plan_json(tmp_path):
    (tmp_path / "prose.txt").write_text("\n\n".join(f"A sentence of prose, number {i}, long enough to fill a window." for i in range(80)))
    (tmp_path / "code.txt").write_text("\n\n".join(f"def f{i}(x): return x * {i}" for i in range(20)))
    cfg = compose(
        [
            "mode=plan",
            "data=mixture",
            f"data.sources=[{{path: {tmp_path / 'prose.txt'}, weight: 0.8}}, {{path: {tmp_path / 'code.txt'}, weight: 0.2, name: code}}]",
            "data.seq_len=16",
            "data.tokenize_workers=0",
            f"data.cache_dir={tmp_path / 'cache'}",
            "trainer.max_steps=40",
        ]
    )
    plan = run_stages(cfg, tmp_path / "run")
    written = json.loads((tmp_path / "run" / "plan.json").read_text())["data_mixture"]
    assert written == plan.to_dict()["data_mixture"]
    prose, code = written["sources"]
    assert (prose["name"], code["name"]) == ("prose", "code") and written["exhaustion"] == "repeat"
    assert prose["share"] == pytest.approx(0.8) and code["share"] == pytest.approx(0.2)
    assert prose["tokens"] == prose["items"] * 16 and prose["items"] > 5 * code["items"]
    assert code["drawn_items"] == pytest.approx(0.2 * 8 * 40) and code["passes"] == pytest.approx(code["drawn_items"] / code["items"])
    lines = plan.render().splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("mixture    2 sources over 40 steps, data.exhaustion=repeat"))
    assert lines[header + 1].split() == ["source", "weight", "share", "tokens/pass", "windows/pass", "windows", "drawn", "(expected)", "passes", "first", "pass", "ends"]
    assert lines[header + 2].split()[:3] == ["prose", "0.8", "80.0%"]
    assert lines[header + 3].split()[:3] == ["code", "0.2", "20.0%"] and f"{code['passes']:.2f}" in lines[header + 3]

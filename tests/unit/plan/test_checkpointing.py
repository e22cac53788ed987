"""The planner counts every activation-checkpointing mode, prints each one's memory and step time,
and auto takes the cheapest that fits (plan/checkpointing.py); the old booleans still mean full/none."""

import dataclasses

import pytest

from tests.conftest import plan
from tinytrain.config.schema import Checkpointing, Strategy
from tinytrain.plan import parallel
from tinytrain.plan.activations import Layout
from tinytrain.plan.checkpointing import BY_COST, ModeCost, choose
from tinytrain.plan.memory import activation_memory
from tinytrain.plan.model_shape import ModelShape

LLAMA3_8B = ModelShape(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256, tied_embeddings=False, qkv_bias=False)
SHAPE = dict(shape=LLAMA3_8B, layout=Layout.mixed, seq=8192, micro_batch=1, tp=1, flash=True)
BIG = ["model=llama3_1_8b", "hardware.gpu=H100", "parallel=zero3", "cluster.devices=8", "data.seq_len=8192", "trainer.global_batch_size=32"]


def test_each_mode_keeps_less_than_the_one_before():
    none, selective, full = (activation_memory(checkpointing=m, **SHAPE) for m in BY_COST)
    assert none > selective > full
    # every second block in full (selective where the op policy cannot run): between full and none
    halves = activation_memory(checkpointing=Checkpointing.selective, every=2, **SHAPE)
    assert full < halves < none
    with pytest.raises(ValueError):
        activation_memory(checkpointing=Checkpointing.auto, **SHAPE)


def cost(mode, fits, total=2.0):
    return ModeCost(4, mode.value, 1.0, total, fits, None)


@pytest.mark.parametrize(
    ("fits", "expected"),
    [((True, True, True), "none"), ((False, True, True), "selective"), ((False, False, True), "full"), ((None, None, None), "none")],
)
def test_auto_takes_the_cheapest_mode_that_fits(fits, expected):
    c = choose(Checkpointing.auto, [cost(m, f) for m, f in zip(BY_COST, fits)], None)
    assert (c.requested, c.mode, c.every) == ("auto", expected, 1)


@pytest.mark.parametrize(("totals", "expected"), [((90.0, 60.0, 30.0), "full"), ((104.50, 105.21, 105.21), "none"), ((50.0, 40.0, 40.0), "selective")])
def test_auto_where_no_mode_fits_takes_the_one_that_needs_least(totals, expected):
    # Where the step peaks in its gradients or optimizer step (Llama-3-8B on one A10), recomputing
    # saves nothing: the plan does not say full saves the most when none needs less.
    c = choose(Checkpointing.auto, [cost(m, False, t) for m, t in zip(BY_COST, totals)], None)
    assert c.mode == expected and f"no mode fits; {expected} needs the least" in c.reason


def test_selective_without_the_op_policy_checkpoints_every_second_block():
    c = choose(Checkpointing.selective, [], "the engine's hooks")
    assert (c.mode, c.every) == ("selective", 2) and "the engine's hooks" in c.how


@pytest.mark.parametrize(("batch", "expected"), [("1", "none"), ("4", "full")])
def test_the_plan_prints_each_mode_and_the_choice(batch, expected, tmp_path, capsys):
    p = plan([*BIG, f"trainer.micro_batch_size={batch}", "trainer.activation_checkpointing=auto"], tmp_path)
    c = p["activation_checkpointing"]
    assert c["mode"] == p["fast_paths"]["activation_checkpointing"] == expected
    assert [row["mode"] for row in c["table"]] == ["none", "selective", "full"]
    steps = [row["step_s"] for row in c["table"]]
    assert steps[0] < steps[1] < steps[2]  # recompute costs time
    chosen = next(row for row in c["table"] if row["mode"] == expected)
    assert p["memory_per_gpu"]["activations_gib"] == chosen["activations_gib"]
    out = capsys.readouterr().out
    assert f"{expected:<9} activations" in out and "<- chosen" in out


@pytest.mark.parametrize(("value", "mode"), [("true", "full"), ("false", "none"), ("selective", "selective")])
def test_old_booleans_and_modes_resolve_into_the_config(value, mode, tmp_path):
    p = plan([f"trainer.activation_checkpointing={value}", "trainer.compile=false"], tmp_path)
    assert p["fast_paths"]["activation_checkpointing"] == mode and p["fast_paths"]["compile"] == "none"
    assert f"activation_checkpointing: {mode}" in (tmp_path / "config_resolved.yaml").read_text()


def test_zero3_takes_the_op_policy_for_selective(tmp_path, capsys):
    """ZeRO-3 gathers each layer's weights whole (model/zero3_layers.py), so no gather inside a
    block stands in the op policy's replay: every block selective, as under ZeRO-2. The plan says
    how ZeRO-3 gathers."""
    for zero in ("zero3", "zero2"):
        capsys.readouterr()
        p = plan([f"parallel={zero}", "hardware.gpu=A100", "trainer.activation_checkpointing=selective"], tmp_path / zero)
        assert p["fast_paths"]["checkpoint_every"] == 1 and "selective checkpoint policy" in p["activation_checkpointing"]["how"]
        assert ("each decoder layer gathered whole" in capsys.readouterr().out) == (zero == "zero3")


def test_the_row_decides_the_op_policy(monkeypatch, tmp_path):
    ddp = parallel.STRATEGIES[Strategy.ddp]
    monkeypatch.setitem(parallel.STRATEGIES, Strategy.ddp, dataclasses.replace(ddp, op_checkpoint_off=lambda zero_stage: "ddp-x: not checked"))
    p = plan(["parallel=ddp", "cluster.devices=2", "trainer.activation_checkpointing=selective"], tmp_path)
    assert p["fast_paths"]["checkpoint_every"] == 2 and "ddp-x: not checked" in p["activation_checkpointing"]["how"]

"""The learning-rate schedules of tinytrain/plan/schedule.py, from composed trainer settings."""

import math

import pytest

from tests.conftest import compose
from tinytrain.plan.schedule import from_trainer, picture


def schedule(*overrides):
    return from_trainer(compose(["trainer.max_steps=100", "trainer.warmup_steps=10", "trainer.min_lr_ratio=0.1", *overrides]).trainer)


def test_cosine_is_the_default_and_the_old_warmup_cosine():
    s = schedule()
    assert [s.multiplier(k) for k in (0, 9)] == [0.1, 1.0]
    assert math.isclose(s.multiplier(55), 0.55) and math.isclose(s.multiplier(100), 0.1)


def test_linear_and_constant():
    linear, constant = schedule("trainer.lr_schedule=linear"), schedule("trainer.lr_schedule=constant")
    assert math.isclose(linear.multiplier(55), 0.55) and math.isclose(linear.multiplier(32.5), 0.775)
    assert [constant.multiplier(k) for k in (4, 10, 99, 500)] == [0.5, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "shape, quarter",  # the multiplier a quarter into the decay: 0.1 + 0.9 f(0.25)
    [("linear", 0.1 + 0.9 * 0.75), ("cosine", 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))), ("one_minus_sqrt", 0.1 + 0.9 * 0.5)],
)
def test_wsd_holds_the_peak_then_decays_over_its_last_steps(shape, quarter):
    s = schedule("trainer.lr_schedule=wsd", "trainer.decay_steps=20", f"trainer.decay_shape={shape}")
    assert s.decay_start == 80
    assert [s.multiplier(k) for k in (10, 50, 79, 80)] == [1.0, 1.0, 1.0, 1.0]
    assert math.isclose(s.multiplier(85), quarter) and math.isclose(s.multiplier(100), 0.1)
    assert [p[0] for p in s.phases()] == ["warmup", "stable", f"decay ({s.shape.value})"]


def test_wsd_decay_fraction_is_of_the_whole_run():
    assert schedule("trainer.lr_schedule=wsd", "trainer.decay_fraction=0.3").decay_start == 70


def test_the_picture_shows_warmup_plateau_and_decay():
    s = schedule("trainer.lr_schedule=wsd", "trainer.decay_steps=20", "trainer.decay_shape=linear")
    lines = picture(s.to_dict(), 100, width=50, height=5, marks={60: "|"})
    top, axis = lines[0], lines[-2]
    assert top.startswith("  1.0 |") and axis.startswith("  0.0 +") and axis[7 + round(60 * 49 / 99)] == "|"
    plateau = top[7:]
    assert plateau[0] == " " and plateau[25] == "#" and plateau[-1] == " "  # warming up, stable, decayed

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
    assert math.isclose(s.multiplier(54), 0.55) and math.isclose(s.multiplier(99), 0.1)


def test_linear_and_constant():
    linear, constant = schedule("trainer.lr_schedule=linear"), schedule("trainer.lr_schedule=constant")
    assert math.isclose(linear.multiplier(54), 0.55) and math.isclose(linear.multiplier(31.5), 0.775) and math.isclose(linear.multiplier(99), 0.1)
    assert [constant.multiplier(k) for k in (4, 10, 99, 500)] == [0.5, 1.0, 1.0, 1.0]


@pytest.mark.parametrize(
    "shape, quarter",  # the multiplier a quarter into the decay: 0.1 + 0.9 f(0.25)
    [("linear", 0.1 + 0.9 * 0.75), ("cosine", 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4))), ("one_minus_sqrt", 0.1 + 0.9 * 0.5)],
)
def test_wsd_holds_the_peak_then_decays_over_its_last_steps(shape, quarter):
    s = schedule("trainer.lr_schedule=wsd", "trainer.decay_steps=20", f"trainer.decay_shape={shape}")
    assert s.decay_start == 80
    assert [s.multiplier(k) for k in (10, 50, 79)] == [1.0, 1.0, 1.0] and s.multiplier(80) < 1.0
    assert math.isclose(s.multiplier(84), quarter) and math.isclose(s.multiplier(99), 0.1)
    assert [p[0] for p in s.phases()] == ["warmup", "stable", f"decay ({s.shape.value})"]


@pytest.mark.parametrize("kind", ["cosine", "linear", "wsd"])
def test_the_last_trained_step_sits_at_the_end_of_the_decay(kind):
    """Steps 0..max_steps-1 are trained (step max_steps never is): the last one trains at
    min_lr_ratio x lr, and every decay step below the peak, each lower than the one before."""
    s = schedule(f"trainer.lr_schedule={kind}", *(["trainer.decay_steps=20"] if kind == "wsd" else []))
    rates = [s.multiplier(k) for k in range(100)]
    decay = rates[s.decay_start :]
    assert math.isclose(rates[-1], 0.1)
    assert all(r < 1.0 for r in decay) and all(a > b for a, b in zip(decay, decay[1:]))


def test_a_wsd_decay_of_one_step_trains_that_step_at_the_minimum():
    """trainer.decay_steps=1 used to end its decay at step max_steps, never trained: every step
    trained at the peak."""
    s = schedule("trainer.lr_schedule=wsd", "trainer.decay_steps=1")
    rates = [s.multiplier(k) for k in range(100)]
    assert rates[:10] == [(k + 1) / 10 for k in range(10)]
    assert rates[10:99] == [1.0] * 89 and math.isclose(rates[99], 0.1)


def test_wsd_decay_fraction_is_of_the_whole_run():
    assert schedule("trainer.lr_schedule=wsd", "trainer.decay_fraction=0.3").decay_start == 70


def test_the_picture_shows_warmup_plateau_and_decay():
    s = schedule("trainer.lr_schedule=wsd", "trainer.decay_steps=20", "trainer.decay_shape=linear")
    lines = picture(s.to_dict(), 100, width=50, height=5, marks={60: "|"})
    top, axis = lines[0], lines[-2]
    assert top.startswith("  1.0 |") and axis.startswith("  0.0 +") and axis[7 + round(60 * 49 / 99)] == "|"
    plateau = top[7:]
    assert plateau[0] == " " and plateau[25] == "#" and plateau[-1] == " "  # warming up, stable, decayed


def test_under_a_batch_ramp_the_picture_is_drawn_in_steps_of_the_final_batch():
    """A ramp from 8 to 32 sequences over 64 x 64 tokens: 100 optimizer steps train 96.5 steps of
    the final batch, and the plan's phases say so (decay 76.5-96.5). The picture used to label its
    axis 0-100 and draw the schedule as if it counted optimizer steps; it is drawn in the schedule's
    own steps now, labelled as such."""
    trainer = compose(["trainer.max_steps=100", "trainer.warmup_steps=10", "trainer.global_batch_size=32", "data.seq_len=64", "trainer.lr_schedule=wsd", "trainer.decay_steps=20", "trainer.decay_shape=linear", "trainer.batch_size_warmup.start=8", "trainer.batch_size_warmup.tokens=4096"]).trainer
    from tinytrain.data.batch_ramp import BatchRamp

    ramp = BatchRamp(8, 32, 8, 64, 64)
    s = from_trainer(trainer, ramp)
    d = s.to_dict()
    assert d["total_steps"] == pytest.approx(ramp.equivalent_step(100)) and d["total_steps"] < 100
    assert d["decay_start"] == pytest.approx(d["total_steps"] - 20)
    lines = picture(d, 100, width=50, height=5)
    top, label = lines[0][7:], lines[-1]
    last_high = max(i for i, c in enumerate(top) if c == "#")  # the last column still at the peak
    assert last_high == math.floor(d["decay_start"] * 49 / (d["total_steps"] - 1))
    assert label.endswith(f"{d['total_steps']:g} (steps of the final batch: the schedule counts tokens)")
    # every optimizer step reads the schedule where its tokens put it, the last at the decay's end
    assert s.position(100) == pytest.approx(d["total_steps"]) and math.isclose(s.multiplier(99), 0.1)

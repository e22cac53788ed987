"""The plan carries the margin a GPU run measured against its activation formula
(plan/memory_margin.py): where a run measured more, the plan counts what it measured (the memory
line, the checkpointing table and micro_batch_size=auto alike) and says so; where it measured less,
the plan prints it and keeps its estimate; layouts no run measured are planned as before."""

import pytest

from tests.conftest import plan
from tinytrain.config.schema import Checkpointing
from tinytrain.plan.activations import Layout
from tinytrain.plan.memory import GIB, activation_memory
from tinytrain.plan.memory_margin import Measured, measured
from tinytrain.plan.model_shape import ModelShape
from tinytrain.plan.run_plan import fit_lines

HEADLINE = ["model=tinyllama_1b", "model.vocab_size=32000", "data.seq_len=2048", "hardware.gpu=H100", "trainer.global_batch_size=64"]
TINYLLAMA = ModelShape(hidden=2048, layers=22, heads=32, kv_heads=4, intermediate=5632, vocab=32000, tied_embeddings=False, qkv_bias=False)
FORMULA_NONE = activation_memory(shape=TINYLLAMA, layout=Layout.mixed, seq=2048, micro_batch=8, tp=1, flash=True) / GIB
# DeepSpeed casts the model to 16-bit: a bf16 residual stream, no autocast copies
SIXTEEN_BIT_NONE = activation_memory(shape=TINYLLAMA, layout=Layout.sixteen_bit, seq=2048, micro_batch=8, tp=1, flash=True) / GIB


@pytest.fixture
def measured_less(monkeypatch):
    """A run that measured 0.8x the estimate with selective checkpointing."""
    from tinytrain.plan import memory_margin

    less = Measured(("single", "ddp"), "bf16-mixed", Checkpointing.selective, 10.0, 8.0, "a run measuring 0.8x")
    monkeypatch.setattr(memory_margin, "MEASURED", (less,))
    return less


def test_a_run_that_measured_less_is_printed_not_applied(tmp_path, measured_less):
    p = plan([*HEADLINE, "trainer.micro_batch_size=8", "trainer.activation_checkpointing=selective"], tmp_path)
    memory = p["memory_per_gpu"]
    formula = activation_memory(shape=TINYLLAMA, layout=Layout.mixed, seq=2048, micro_batch=8, tp=1, flash=True, checkpointing=Checkpointing.selective) / GIB
    assert memory["activations_gib"] == pytest.approx(formula, abs=0.01) and memory["margin"]["ratio"] == pytest.approx(0.8) and memory["margin"]["factor"] == 1.0
    line = next(x for x in fit_lines(p) if x.startswith("memory "))
    assert "activations measured 0.80x the formula for selective (a run measuring 0.8x): not applied" in line


def test_without_a_measurement_the_plan_prints_its_count_alone(tmp_path):
    """No GPU run stands for today's count (plan/memory_margin.py says why): the memory line is the
    formula, with no margin clause."""
    p = plan([*HEADLINE, "trainer.micro_batch_size=8", "trainer.activation_checkpointing=none"], tmp_path)
    memory = p["memory_per_gpu"]
    assert memory["margin"] is None and memory["activations_gib"] == pytest.approx(FORMULA_NONE, abs=0.01)
    assert "measured" not in next(x for x in fit_lines(p) if x.startswith("memory "))


@pytest.fixture
def measured_more(monkeypatch):
    """A run that measured 1.2x the estimate without checkpointing: where a run measures more, the
    plan counts what it measured."""
    from tinytrain.plan import memory_margin

    more = Measured(("single", "ddp"), "bf16-mixed", Checkpointing.none, FORMULA_NONE, 1.2 * FORMULA_NONE, "a run measuring 1.2x")
    monkeypatch.setattr(memory_margin, "MEASURED", (more,))
    return more


def test_a_run_that_measured_more_is_counted_at_what_it_measured(tmp_path, measured_more):
    p = plan([*HEADLINE, "trainer.micro_batch_size=8", "trainer.activation_checkpointing=none"], tmp_path)
    memory = p["memory_per_gpu"]
    assert memory["activations_gib"] == pytest.approx(1.2 * FORMULA_NONE, abs=0.01) and memory["margin"]["factor"] == pytest.approx(1.2)
    line = next(x for x in fit_lines(p) if x.startswith("memory "))
    assert "activations measured 1.20x the formula for none (a run measuring 1.2x): x1.20 applied" in line
    row = next(r for r in p["activation_checkpointing"]["table"] if r["mode"] == "none")
    assert row["activations_gib"] == pytest.approx(1.2 * FORMULA_NONE, abs=0.01)  # the table the choice is made from counts it too


def test_layouts_no_run_measured_keep_the_formula(tmp_path):
    p = plan([*HEADLINE, "parallel=zero2", "trainer.micro_batch_size=8", "trainer.activation_checkpointing=none"], tmp_path)
    assert p["memory_per_gpu"]["margin"] is None and p["memory_per_gpu"]["activations_gib"] == pytest.approx(SIXTEEN_BIT_NONE, abs=0.01)
    assert measured("single", "32-true", Checkpointing.none) is None and measured("fsdp_tp", "bf16-mixed", "none") is None


def test_auto_micro_batch_picks_from_the_measured_memory(tmp_path, measured_more):
    """On a 40 GB A100 (37.3 GiB, auto's line at 90%: 33.5) at 1280 tokens, micro batch 4 fits by
    the formula (15.2 GiB of activations beside 16.4 of model states), not at the measured 1.2x:
    auto takes 2, counted at what was measured."""
    gpu = [x if not x.startswith("hardware.gpu=") else "hardware.gpu=A100-40G" for x in HEADLINE]
    gpu = [x if not x.startswith("data.seq_len=") else "data.seq_len=1280" for x in gpu]
    formula = {mb: activation_memory(shape=TINYLLAMA, layout=Layout.mixed, seq=1280, micro_batch=mb, tp=1, flash=True) / GIB for mb in (2, 4)}
    p = plan([*gpu, "trainer.micro_batch_size=auto", "trainer.activation_checkpointing=none"], tmp_path)
    memory = p["memory_per_gpu"]
    states = memory["params_gib"] + memory["grads_gib"] + memory["optimizer_gib"]
    assert states + formula[4] < 0.9 * 40e9 / GIB < states + 1.2 * formula[4]
    assert p["batch"]["micro_batch_size"] == 2 and memory["activations_gib"] == pytest.approx(1.2 * formula[2], abs=0.01)


@pytest.mark.parametrize(("mode", "vocab", "peak_from"), [("none", 32000, "the loss's backward"), ("full", 4096, "the last layer's recompute")])
def test_the_memory_line_says_what_the_activations_are_made_of(tmp_path, mode, vocab, peak_from):
    """plan.json's activation_parts add up to the activations counted, and the line under the
    memory line prints them: TinyLlama in bf16-mixed on one H100, autocast's copies of every
    projection kept without checkpointing, the lm_head's alone under full (where, with a small
    vocab, the last layer's recompute outgrows the loss's backward)."""
    run = [x if not x.startswith("model.vocab_size=") else f"model.vocab_size={vocab}" for x in HEADLINE]
    p = plan([*run, "trainer.micro_batch_size=8", f"trainer.activation_checkpointing={mode}"], tmp_path)
    memory, parts = p["memory_per_gpu"], p["memory_per_gpu"]["activation_parts"]
    assert sum(parts[k] for k in ("layers_gib", "weight_copies_gib", "ends_and_loss_gib", "backward_peak_gib")) == pytest.approx(memory["activations_gib"], abs=0.01)
    head = 2 * vocab * TINYLLAMA.hidden / GIB
    assert parts["weight_copies_gib"] > 10 * head if mode == "none" else parts["weight_copies_gib"] == pytest.approx(head, abs=1e-3)
    assert parts["backward_peak_from"] == peak_from
    lines = fit_lines(p)
    line = lines[next(i for i, x in enumerate(lines) if x.startswith("memory ")) + 1]
    assert line.startswith("           activations: ") and f"({peak_from})" in line and "autocast's weight copies" in line

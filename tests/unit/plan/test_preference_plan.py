"""finetune.objective=dpo|ipo|simpo in validation and the plan: settings checked with key, value and
fix; where the reference comes from; the memory line counting a frozen reference copy; full
fine-tuning that fits only without the copy refused with the way out."""

import json

import pytest

from tests.conftest import compose, plan
from tinytrain.errors import ConfigError
from tinytrain.plan import preference
from tinytrain.plan.validate import validate


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text(json.dumps({"prompt": "Q?", "chosen": "Yes.", "rejected": "No."}) + "\n")
    return path


def problems_of(overrides) -> str:
    with pytest.raises(ConfigError) as e:
        validate(compose(overrides))
    return str(e.value)


@pytest.mark.parametrize(
    "overrides, expected",
    [
        (["finetune.objective=dpo"], "data.format='text': finetune.objective=dpo trains on preference pairs. Fix: set data.format=preference"),
        (["finetune.beta=0"], "finetune.beta=0.0: must be positive"),
        (["finetune.beta=-1", "finetune.objective=ipo"], "finetune.beta=-1.0: must be positive"),
        (["finetune.label_smoothing=0.5"], "finetune.label_smoothing=0.5: must be in [0, 0.5)"),
        (["finetune.objective=ipo", "finetune.label_smoothing=0.1"], "finetune.label_smoothing=0.1: ipo has no label smoothing"),
        (["finetune.objective=simpo", "finetune.precompute_reference=true"], "finetune.precompute_reference=true: simpo is reference-free"),
        (["data.pack=true"], "data.pack=true: preference pairs are scored row by row"),
        (["data.train_on=all"], "data.train_on='all': a preference pair is scored on its answers only"),
    ],
)
def test_bad_settings_name_key_value_and_fix(pairs, overrides, expected):
    base = [] if overrides == ["finetune.objective=dpo"] else ["data=jsonl", "data.format=preference", f"data.path={pairs}", "finetune.objective=dpo"]
    assert expected in problems_of([*base, *overrides])


def test_preference_data_needs_a_preference_objective(pairs):
    assert "finetune.objective='sft': data.format=preference holds chosen/rejected pairs" in problems_of(["data=jsonl", "data.format=preference", f"data.path={pairs}"])


@pytest.mark.parametrize(
    "overrides, reference",
    [
        ([], preference.FROZEN_COPY),
        (["finetune.precompute_reference=true"], preference.PRECOMPUTED),
        (["finetune=lora"], preference.ADAPTERS_OFF),
        (["finetune.objective=simpo"], preference.NONE),
    ],
)
def test_where_the_reference_comes_from(pairs, overrides, reference):
    cfg = compose(["data=jsonl", "data.format=preference", f"data.path={pairs}", "finetune.objective=dpo", *overrides])
    plan = preference.make(cfg, params=1000, world=1)
    assert plan.reference == reference
    assert plan.reference_bytes == (4000 if reference == preference.FROZEN_COPY else 0)


@pytest.mark.parametrize("strategy, world, tp, stage, expected", [("single", 1, 1, 0, 4000), ("ddp", 2, 1, 0, 4000), ("deepspeed", 4, 1, 2, 2000), ("deepspeed", 4, 1, 3, 500), ("fsdp_tp", 4, 2, 0, 1000)])
def test_the_frozen_copy_is_held_like_the_policy(strategy, world, tp, stage, expected):
    assert preference.reference_bytes(strategy, 1000, world=world, tp=tp, zero_stage=stage, offload_params=False) == expected


def test_the_memory_line_counts_the_reference_and_refuses_a_copy_that_does_not_fit(pairs, tmp_path, capsys):
    """A 1B model fully fine-tuned on a 24 GB A10: it fits without the frozen copy, not with it."""
    run = ["model=tinyllama_1b", "data=jsonl", "data.format=preference", f"data.path={pairs}", "data.chat_template=alpaca", "finetune.objective=dpo", "hardware.gpu=A10", "trainer.micro_batch_size=24"]
    with pytest.raises(ConfigError) as e:
        plan(run, tmp_path / "online")
    message = str(e.value)
    assert "finetune.precompute_reference=false: dpo on full fine-tuning holds a frozen reference copy" in message and "Fix: set finetune.precompute_reference=true" in message
    precomputed = plan([*run, "finetune.precompute_reference=true"], tmp_path / "precomputed")
    assert precomputed["memory_per_gpu"]["fits"] and precomputed["memory_per_gpu"]["reference_gib"] == 0
    small = plan([*run, "trainer.micro_batch_size=1"], tmp_path / "small")
    m = small["memory_per_gpu"]
    assert m["reference_gib"] == pytest.approx(m["params_gib"]) and m["fits"]  # fp32, like AMP's weights
    held = m["grads_gib"] if m["step"]["grads_held"] else 0.0  # plan/step_peak.py
    in_backward = m["params_gib"] + m["optimizer_gib"] + m["reference_gib"] + held + m["activations_gib"]
    assert m["total_gib"] == pytest.approx(max(in_backward, m["params_gib"] + m["optimizer_gib"] + m["reference_gib"] + m["grads_gib"] + m["step"]["optimizer_step_gib"]), abs=0.01)
    out = capsys.readouterr().out
    assert "objective  dpo: beta 0.1; reference: a frozen copy of the initial weights, held like the policy" in out and f"+ reference {m['reference_gib']:.2f}" in out
    assert "per step, " in out and " steps (pairs x data.seq_len; each trains its chosen and rejected rows)" in out  # not the rows' tokens


def test_the_step_time_counts_both_rows_of_a_pair_and_the_reference_forward(pairs, tmp_path):
    """DPO was planned at SFT's step time for the same batch: a pair trains two rows, and an online
    reference scores both (a forward: a third of a row's training)."""
    base = ["model=tinyllama_1b", "hardware.gpu=A100", "data.seq_len=512", "trainer.micro_batch_size=2", "trainer.global_batch_size=8", "trainer.activation_checkpointing=none"]
    dpo = [*base, "data=jsonl", "data.format=preference", f"data.path={pairs}", "data.chat_template=alpaca", "finetune.objective=dpo"]

    def seconds(overrides, name):
        table = plan(overrides, tmp_path / name)["activation_checkpointing"]["table"]
        return next(r["step_s"] for r in table if r["mode"] == "none")

    sft = seconds([*base, "data=alpaca"], "sft")
    assert seconds(dpo, "online") == pytest.approx(sft * (2 + 2 / 3))
    assert seconds([*dpo, "finetune.precompute_reference=true"], "precomputed") == pytest.approx(sft * 2)
    assert seconds([*dpo, "finetune.objective=simpo"], "simpo") == pytest.approx(sft * 2)


def test_kto_s_refusals_do_not_suggest_the_precomputed_reference_kto_refuses():
    """kto forms its KL rows per micro batch and refuses finetune.precompute_reference=true
    (kto_problems): a refusal suggesting it sent the user into that refusal next."""
    from types import SimpleNamespace

    from tinytrain.plan.memory import GIB

    rows = SimpleNamespace(trainable_token_ids=[5, 6], trainable_tokens_reason="2 token(s) added beyond the base's 4096 rows: ...")
    for name, fix in (("kto", "set finetune.trainable_tokens=none"), ("dpo", "set finetune.precompute_reference=true (the reference's log-probs computed before training), or finetune.trainable_tokens=none")):
        with pytest.raises(ConfigError) as e:
            preference.trainable_rows_problem(preference.PreferencePlan(name, 0.1, 0.0, 0.0, preference.ADAPTERS_OFF, 0.0), rows)
        assert e.value.problems[0].fix == fix
    memory = SimpleNamespace(fits=False, total_gib=24.0, gpu_memory_gib=22.4)
    for name, fix in (("kto", "use finetune=lora (the reference is the base with adapters off), or a higher ZeRO stage / parallel=fsdp_tp"), ("dpo", "set finetune.precompute_reference=true (its log-probs computed once before training, no copy held), or finetune=lora")):
        with pytest.raises(ConfigError) as e:
            preference.memory_problem(preference.PreferencePlan(name, 0.1, 0.0, 0.0, preference.FROZEN_COPY, 2 * GIB), memory)
        assert e.value.problems[0].fix.startswith(fix)

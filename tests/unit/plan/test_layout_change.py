"""Resume under another layout, decided in the plan: the matrix {single, ddp, zero1, zero2, zero3,
fsdp_tp tp1/tp2} x world size {1, 2}, saved -> resumed, each cell accepted or refused naming the
checkpoint's layout, the run's and the fix. (Real resumes across the accepted change classes, and a
refusal from a real checkpoint folder, are in tests/integration/test_sharded_checkpoints.py.)"""

import itertools
from pathlib import Path

import pytest

from tinytrain.errors import ConfigError
from tinytrain.plan.layout_change import Layout, check_layout, refusal, run_layout

# (name, strategy, world, tp, zero stage); fsdp_tp tp2 needs two ranks.
LAYOUTS = [
    (f"{name}-w{world}", strategy, world, tp, stage)
    for name, strategy, tp, stage in [("single", "single", 1, 0), ("ddp", "ddp", 1, 0), ("zero1", "deepspeed", 1, 1), ("zero2", "deepspeed", 1, 2), ("zero3", "deepspeed", 1, 3), ("fsdp_tp1", "fsdp_tp", 1, 0), ("fsdp_tp2", "fsdp_tp", 2, 0)]
    for world in (1, 2)
    if not (strategy == "single" and world == 2) and not (tp == 2 and world == 1)
]


def layout(strategy, world, tp, stage) -> Layout:
    return run_layout(strategy, world, world // tp, tp, stage)


def expected(saved, run) -> bool:
    """The supported changes, written out: full-tensor files anywhere but DeepSpeed; sharded
    folders under fsdp_tp only; DeepSpeed under DeepSpeed in the same ZeRO family (1 <-> 2 share a
    format, 3 does not), on any dp (another one is converted to DeepSpeed's universal checkpoint)."""
    (_, s_strategy, _, _, s_stage), (_, r_strategy, _, _, r_stage) = saved, run
    if s_strategy in ("single", "ddp"):
        return r_strategy != "deepspeed"
    if s_strategy == "fsdp_tp":
        return r_strategy == "fsdp_tp"
    same_format = s_stage == r_stage or 3 not in (s_stage, r_stage)
    return r_strategy == "deepspeed" and same_format


@pytest.mark.parametrize("saved, run", list(itertools.product(LAYOUTS, LAYOUTS)), ids=lambda c: c[0])
def test_every_pair_resumes_or_is_refused_with_both_layouts_and_the_fix(saved, run):
    ours, theirs = layout(*saved[1:]), layout(*run[1:])
    refused = refusal(ours, theirs)
    assert (refused is None) == expected(saved, run)
    if refused is None:
        assert check_layout(Path("/ckpt/step0000004.ckpt"), {"tinytrain": {"layout": ours.to_dict()}}, theirs) == ours
        return
    with pytest.raises(ConfigError) as e:
        check_layout(Path("/ckpt/step0000004.ckpt"), {"tinytrain": {"layout": ours.to_dict()}}, theirs)
    message = str(e.value)
    assert message.startswith("tinytrain: configuration error: resume='/ckpt/step0000004.ckpt': saved as ")
    assert f"saved as {ours.describe()}; this run is {theirs.describe()}" in message
    assert "checkpoint.init_from=/ckpt/step0000004.ckpt" in message


def test_a_refusal_names_the_parallel_option_and_drops_the_resume_it_was_given():
    """It named parallel=deepspeed (no such option: the user wrote parallel=zero2), and its fix
    run.name=<new> checkpoint.init_from=<ckpt> kept resume=<ckpt>, which takes precedence."""
    sharded, zero2 = layout("fsdp_tp", 2, 2, 0), layout("deepspeed", 2, 1, 2)
    path = "/runs/a/checkpoints/step0000004.ckpt"
    with pytest.raises(ConfigError) as e:
        check_layout(Path(path), {"tinytrain": {"layout": sharded.to_dict()}}, zero2, resume=path, parallel="zero2")
    problem = e.value.problems[0]
    assert problem.message.endswith("parallel=zero2 cannot load a sharded fsdp_tp checkpoint") and "deepspeed cannot" not in problem.message
    assert problem.fix == f"resume with parallel=fsdp_tp (any world size and tp), or start a new run from its weights only: run.name=<new> checkpoint.init_from={path} without resume={path} (a resume takes precedence over checkpoint.init_from)"


def test_a_checkpoint_without_a_recorded_layout_is_read_from_the_disk(tmp_path):
    from tinytrain.plan.layout_change import saved_layout

    ds = tmp_path / "step0000004.ckpt"
    (ds / "checkpoint").mkdir(parents=True)
    for r in range(4):
        (ds / "checkpoint" / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt").touch()
    (ds / "checkpoint" / "mp_rank_00_model_states.pt").touch()
    assert saved_layout(ds, {"tinytrain": {"tp": 1}}) == Layout("deepspeed", "deepspeed", 4, 4, 1, 2)
    file = tmp_path / "step0000008.ckpt"
    file.touch()
    assert saved_layout(file, {"tinytrain": {"tp": 2}}) == Layout("file", "unknown", 1, 1, 2)


def test_a_deepspeed_dp_change_converts_and_a_same_dp_one_does_not():
    from tinytrain.plan.layout_change import converts

    saved = layout("deepspeed", 2, 1, 2)
    assert converts(saved, layout("deepspeed", 1, 1, 2)) and converts(saved, layout("deepspeed", 4, 1, 1))
    assert converts(layout("deepspeed", 2, 1, 3), layout("deepspeed", 1, 1, 3))
    assert not converts(saved, layout("deepspeed", 2, 1, 1)) and not converts(saved, layout("ddp", 1, 1, 0))

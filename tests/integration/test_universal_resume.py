"""A DeepSpeed ZeRO-2 or ZeRO-3 step checkpoint saved on 2 ranks resumes on 1: the plan sees the
other data-parallel size, rank 0 converts it to DeepSpeed's universal checkpoint (a sibling
folder, published atomically), and the run loads it with `load_universal`. A half-converted temp
folder left by a kill is removed, never loaded. (~30 s per stage: one 2-rank run, one 1-rank resume.)
The same folder starts a run of another layout through checkpoint.init_from (a few seconds)."""

import math
import shutil

import pytest
import torch

from tests.conftest import DEEPSPEED_ON_CPU, logged, run_cli

pytestmark = pytest.mark.slow

RUN = [
    "experiment=smoke",
    "model.num_layers=2",
    "model.hidden_size=64",
    "model.num_heads=4",
    "model.num_kv_heads=2",
    "model.intermediate_size=128",
    "data.seq_len=32",
    "trainer.log_every_n_steps=1",
    "trainer.lr=1e-2",
    "trainer.progress_bar=false",
    "trainer.plot=false",
    "parallel.deepspeed_on_cpu=true",
]
KEYS = ("fp32", "exp_avg", "exp_avg_sq")


def saved_states(folder, stage: int) -> dict[str, dict[str, torch.Tensor]]:
    """{fp32 | exp_avg | exp_avg_sq: {parameter: its values}} read from a 2-rank folder's
    optimizer partitions, the way DeepSpeed cuts them: ZeRO-1/2 one flat group in equal slices,
    ZeRO-3 each parameter in equal slices (padded to a multiple of the ranks)."""
    ranks = [torch.load(folder / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt", weights_only=False)["optimizer_state_dict"] for r in (0, 1)]
    model_file = "zero_pp_rank_0_mp_rank_00_model_states.pt" if stage == 3 else "mp_rank_00_model_states.pt"
    groups = torch.load(folder / model_file, weights_only=False)["param_shapes"]
    if stage == 3:
        fp32 = [[r["fp32_flat_groups"][g] for r in ranks] for g in range(len(groups))]
        moments = [r["optimizer_state_dict"]["state"] for r in ranks]
    else:
        fp32 = [[r["single_partition_of_fp32_groups"][g] for r in ranks] for g in range(len(groups))]
        moments = [r["base_optimizer_state"]["state"] for r in ranks]
    flats = {"fp32": fp32, **{k: [[m[g][k] for m in moments] for g in range(len(groups))] for k in KEYS[1:]}}
    out: dict = {k: {} for k in KEYS}
    for key, per_group in flats.items():
        for shapes, parts in zip(groups, per_group):
            flat, offset = torch.cat(parts), 0
            for name, shape in shapes.items():
                numel = math.prod(shape)
                if stage == 3:
                    part = math.ceil(numel / len(parts))
                    out[key][name] = torch.cat([p[offset : offset + part] for p in parts])[:numel]
                    offset += part
                else:
                    out[key][name] = flat[offset : offset + numel]
                    offset += numel
    return out


def optimizer_record(folder) -> tuple[list[int], list[float]]:
    """(Adam's step of each group's state, each param group's weight_decay) of a 1-rank DeepSpeed
    step folder's optimizer file."""
    saved = torch.load(folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt", weights_only=False)["optimizer_state_dict"]
    base = saved.get("optimizer_state_dict") or saved["base_optimizer_state"]  # ZeRO-3's, ZeRO-1/2's
    return [int(s["step"]) for s in base["state"].values()], [g["weight_decay"] for g in base["param_groups"]]


def universal_state(folder, key: str, name: str) -> torch.Tensor:
    value = torch.load(folder / "checkpoint" / "zero" / name / f"{key}.pt", weights_only=False)
    return (value["param"] if isinstance(value, dict) else value).flatten()  # ZeRO-1/2 wrap it, ZeRO-3 does not


@pytest.fixture(scope="module", params=["zero2", "zero3"])
def two_ranks(request, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp(request.param) / "run"
    r = run_cli([*RUN, f"parallel={request.param}", *DEEPSPEED_ON_CPU], run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return request.param, run_dir


@pytest.mark.timeout(600)
def test_saved_on_two_ranks_resumes_on_one_through_the_universal_checkpoint(two_ranks, tmp_path):
    option, saved_run = two_ranks
    run_dir = tmp_path / "run"
    shutil.copytree(saved_run, run_dir)
    ckpts = run_dir / "checkpoints"
    for later in ("step0000008.ckpt", "final.ckpt", "final.consolidated.ckpt"):
        path = ckpts / later
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    # A conversion killed half-way: a temp folder that even holds DeepSpeed's tag file.
    half = ckpts / "step0000004.universal.tmp-99999"
    (half / "checkpoint" / "zero").mkdir(parents=True)
    (half / "latest_universal").write_text("checkpoint")

    r = run_cli([*RUN, f"parallel={option}", "cluster.devices=1", "resume=auto"], run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "rank 0 converts it to DeepSpeed's universal checkpoint" in out and "step0000004.universal" in out
    assert not half.exists()  # removed, never loaded
    universal = ckpts / "step0000004.universal"
    assert (universal / "latest_universal").read_text() == "checkpoint"

    # Weights and data position exact: step 5 trains batch 8 (the sampler counts batches over all
    # ranks) with the restored weights, as rank 0 of the 2-rank run did (its logged loss is rank 0's).
    before, after = logged(saved_run, "loss"), logged(run_dir, "loss")
    assert len(after) == 8 and after[:4] == before[:4]
    assert after[4] == before[4]
    assert after[-1] < after[0] - 0.5
    # The optimizer the resumed run stepped: Adam's step counted once per step in every group, and
    # each group's own weight decay (DeepSpeed's ZeRO-3 universal load shared one step tensor
    # between groups, 4 + 2 x 4 = 12 here, and gave the no-decay group the decay group's 0.1).
    steps, decays = optimizer_record(ckpts / "step0000008.ckpt" / "checkpoint")
    assert steps == [8, 8] and decays == [0.1, 0.0], (steps, decays)

    # Optimizer state: the universal per-parameter fp32 master weights and Adam moments equal the
    # 2 ranks' partitions, bit for bit.
    saved = saved_states(saved_run / "checkpoints" / "step0000004.ckpt" / "checkpoint", int(option[-1]))
    assert len(saved["fp32"]) == 21
    for key in KEYS:
        for name, values in saved[key].items():
            assert torch.equal(universal_state(universal, key, name), values), (key, name)


def test_a_step_folder_starts_a_run_of_another_layout_through_init_from(two_ranks, tmp_path):
    """What a refused layout change names as the fix: `checkpoint.init_from=<the DeepSpeed step
    folder>` plans under parallel=single and gives the new run the folder's fp32 master weights,
    bit for bit (it was refused as "no such checkpoint file")."""
    from tests.conftest import compose
    from tinytrain.checkpoint.format import MODULE_PREFIX
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.init_weights import weights_for_run
    from tinytrain.plan.planner import make_plan
    from tinytrain.plan.validate import validate

    option, saved_run = two_ranks
    step = saved_run / "checkpoints" / "step0000004.ckpt"
    cfg = compose([*RUN, "parallel=single", f"checkpoint.init_from={step}"])
    validate(cfg)
    tokenizer = load_from_config(cfg.tokenizer)
    plan = make_plan(cfg, tokenizer, tmp_path)
    assert plan.init_from.saved["true_vocab"] == plan.vocab.true
    weights = weights_for_run(plan.init_from, ["model.embed_tokens.weight", "lm_head.weight"], plan.vocab, tokenizer)
    saved = saved_states(step / "checkpoint", int(option[-1]))["fp32"]
    assert {name.removeprefix(MODULE_PREFIX) for name in saved} == weights.keys()
    for name, values in saved.items():
        assert torch.equal(weights[name.removeprefix(MODULE_PREFIX)].flatten(), values), name

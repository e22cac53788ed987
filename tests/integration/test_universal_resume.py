"""A DeepSpeed ZeRO-2 step checkpoint saved on 2 ranks resumes on 1: the plan sees the other
data-parallel size, rank 0 converts it to DeepSpeed's universal checkpoint (a sibling folder,
published atomically), and the run loads it with `load_universal`. A half-converted temp folder
left by a kill is removed, never loaded. (~30 s: one 2-rank run, one 1-rank resume.)"""

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
    "parallel=zero2",
    "parallel.deepspeed_on_cpu=true",
]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("zero2") / "run"
    r = run_cli([*RUN, *DEEPSPEED_ON_CPU], run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return run_dir


@pytest.mark.timeout(600)
def test_zero2_saved_on_two_ranks_resumes_on_one_through_the_universal_checkpoint(two_ranks, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(two_ranks, run_dir)
    ckpts = run_dir / "checkpoints"
    for later in ("step0000008.ckpt", "final.ckpt", "final.consolidated.ckpt"):
        path = ckpts / later
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    # A conversion killed half-way: a temp folder that even holds DeepSpeed's tag file.
    half = ckpts / "step0000004.universal.tmp-99999"
    (half / "checkpoint" / "zero").mkdir(parents=True)
    (half / "latest_universal").write_text("checkpoint")

    r = run_cli([*RUN, "cluster.devices=1", "resume=auto"], run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout + r.stderr
    assert "rank 0 converts it to DeepSpeed's universal checkpoint" in out and "step0000004.universal" in out
    assert not half.exists()  # removed, never loaded
    universal = ckpts / "step0000004.universal"
    assert (universal / "latest_universal").read_text() == "checkpoint"

    # Weights and data position exact: step 5 trains batch 8 with the restored weights, and rank 0
    # of the 2-rank run trained the same batch at step 5 (its logged loss is rank 0's).
    before, after = logged(two_ranks, "loss"), logged(run_dir, "loss")
    assert len(after) == 8 and after[:4] == before[:4]
    assert after[4] == before[4]
    assert after[-1] < after[0] - 0.5

    # Optimizer state: the universal per-parameter fp32 weights and Adam moments are the 2 ranks'
    # partitions, concatenated in DeepSpeed's parameter order per group, bit for bit.
    folder = two_ranks / "checkpoints" / "step0000004.ckpt" / "checkpoint"
    ranks = [torch.load(folder / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt", weights_only=False)["optimizer_state_dict"] for r in (0, 1)]
    groups = torch.load(folder / "mp_rank_00_model_states.pt", weights_only=False)["param_shapes"]
    assert len(groups) == 2  # weight decay and none
    for g, shapes in enumerate(groups):
        saved = {
            "fp32": torch.cat([s["single_partition_of_fp32_groups"][g] for s in ranks]),
            "exp_avg": torch.cat([s["base_optimizer_state"]["state"][g]["exp_avg"] for s in ranks]),
            "exp_avg_sq": torch.cat([s["base_optimizer_state"]["state"][g]["exp_avg_sq"] for s in ranks]),
        }
        for key, original in saved.items():
            converted = torch.cat([torch.load(universal / "checkpoint" / "zero" / n / f"{key}.pt", weights_only=False)["param"].flatten() for n in shapes])
            assert torch.equal(converted, original[: converted.numel()]), (g, key)
            assert not original[converted.numel() :].any()  # only alignment padding left over

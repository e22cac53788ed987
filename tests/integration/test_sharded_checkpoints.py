"""fsdp_tp's sharded checkpoints (torch.distributed.checkpoint), through real 2-process gloo runs.

One reference run (tp 2 x dp 1, fsdp_tp's default; 12 steps, a checkpoint every 4, the newest 2 kept) saves
synchronously; its folders are the material of the fault tests (a missing, truncated or foreign
shard file, a foreign index), which are in-process and cheap. Two more runs save asynchronously
(checkpoint.async_save): one is SIGKILLed while its step-8 shards are being written (training went
on meanwhile), one gets SIGTERM while its step-4 shards are being written. Costs on 2 shared
cores: ~35 s per 2-process run, 4 runs; the resumes under another layout (tp 2 -> 1 with the vocab
re-padded; a single-process file -> fsdp_tp) ~15-20 s each.
"""

import os
import shutil
import signal
import subprocess

import pytest
import torch

from tests.conftest import assert_checkpoint_size_estimated, metrics_rows, start_cli
from tests.integration.test_resume import MODEL, batches, metrics, wait_for
from tinytrain.checkpoint.files import is_temp
from tinytrain.checkpoint.resume import newest_loadable, read_state
from tinytrain.errors import ConfigError

pytestmark = pytest.mark.slow

RUN = [
    "experiment=smoke",
    *MODEL,
    "data.seq_len=32",
    "trainer.max_steps=12",
    "trainer.log_every_n_steps=1",
    "trainer.progress_bar=false",
    "trainer.export=false",
    "trainer.plot=false",
    "parallel=fsdp_tp",
    "cluster.devices=2",
    'tokenizer.add_special_tokens=["<|x|>"]',  # 4097 tokens: padded to 4224 at tp 2 (parallel.tp's default), 4160 at tp 1
]
TRUE_VOCAB = 4097
SYNC = [*RUN, "checkpoint.keep_last=3"]  # all three step checkpoints kept, for comparisons
ASYNC = [*RUN, "checkpoint.keep_last=2", "checkpoint.async_save=true"]


def start(run_dir, args, env=None) -> subprocess.Popen:
    """The instrumented CLI in a session of its own: a SIGKILL reaches both ranks (killpg)."""
    return start_cli(args, run_dir, {"TT_TEST_BATCH_LOG": str(run_dir / "batches.txt"), "OMP_NUM_THREADS": "1", **(env or {})}, module="tests.integration.instrumented_cli", new_session=True)


def finish(proc, run_dir, timeout=420) -> str:
    try:
        proc.wait(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return (run_dir / "out.log").read_text()


def full_state(folder) -> dict:
    """Every tensor of a sharded folder, through DCP's own converter (not tinytrain's reader)."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    target = folder.parent.parent / f"{folder.name}.full.pt"
    dcp_to_torch_save(folder, target)
    state = torch.load(target, weights_only=False)
    target.unlink()
    return state


def flat_tensors(state, prefix=""):
    if isinstance(state, dict):
        for k, v in state.items():
            yield from flat_tensors(v, f"{prefix}{k}.")
    elif isinstance(state, torch.Tensor):
        yield prefix.rstrip("."), state


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("sharded") / "sync"
    proc = start(run_dir, SYNC)
    out = finish(proc, run_dir)
    assert proc.returncode == 0, out[-3000:]
    return run_dir


def test_every_rank_writes_its_own_shards(reference):
    checkpoints = reference / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["final.ckpt", "step0000004.ckpt", "step0000008.ckpt", "step0000012.ckpt"]
    folder = checkpoints / "step0000012.ckpt"
    assert sorted(p.name for p in folder.iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]
    from tinytrain.checkpoint.sharded import read_index

    index = read_index(folder, "test")
    embed = "state_dict.model.model.embed_tokens.weight"
    rows = index.state_dict_metadata[embed].size[0]
    chunks = sorted((idx.offset[0], info.relative_path) for idx, info in index.storage_data.items() if idx.fqn == embed)
    assert chunks == [(0, "__0_0.distcp"), (rows // 2, "__1_0.distcp")]  # each rank wrote its half of the rows
    moments = [k for k in index.state_dict_metadata if k.startswith("optimizer_0.state.") and k.endswith(".exp_avg")]
    assert len(moments) == len([k for k in index.state_dict_metadata if k.startswith("state_dict.")])
    sizes = [(folder / f"__{r}_0.distcp").stat().st_size for r in (0, 1)]
    assert max(sizes) < 0.6 * sum(sizes)  # neither rank wrote the whole state
    state = read_state(folder)
    assert state["global_step"] == 12 and state["tinytrain"]["padded_vocab"] == rows
    assert state["state_dict"]["model.model.embed_tokens.weight"].shape == (rows, 64)  # from the index alone
    assert_checkpoint_size_estimated(reference, "step0000012.ckpt")  # plan.json's estimate, within 10%


@pytest.fixture
def copied(reference, tmp_path):
    """The reference run's checkpoints/ copied, to break."""
    target = tmp_path / "checkpoints"
    shutil.copytree(reference / "checkpoints", target)
    return target


def refused(path) -> str:
    with pytest.raises(ConfigError) as e:
        read_state(path)
    return str(e.value)


def test_a_missing_rank_shard_is_named_and_resume_auto_falls_back(copied):
    (copied / "step0000012.ckpt" / "__1_0.distcp").unlink()
    message = refused(copied / "step0000012.ckpt")
    assert "step0000012.ckpt" in message and "missing the shard file __1_0.distcp" in message and "resume=auto skips this one" in message
    path, state, skipped = newest_loadable(copied)
    assert path.name == "step0000008.ckpt" and state["global_step"] == 8 and skipped[0][0].name == "step0000012.ckpt"


def test_a_truncated_shard_and_a_shard_of_another_save_are_refused(copied):
    shard = copied / "step0000012.ckpt" / "__1_0.distcp"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    assert "truncated shard file __1_0.distcp" in refused(copied / "step0000012.ckpt")
    # Same model, same sizes, another save: only the save id tells.
    shutil.copy(copied / "step0000008.ckpt" / "__1_0.distcp", shard)
    message = refused(copied / "step0000012.ckpt")
    assert "__1_0.distcp holds rank 1's shards of another save" in message and "copied in from another checkpoint" in message


def test_an_index_that_would_run_code_is_refused(copied, tmp_path):
    import pickle

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (copied / "step0000012.ckpt" / ".metadata").write_bytes(pickle.dumps(Evil()))
    assert "refused: not a DCP index tinytrain writes (unsupported GLOBAL" in refused(copied / "step0000012.ckpt")
    assert not marker.exists()


def test_sigkill_during_an_async_write_keeps_the_previous_checkpoint(reference, tmp_path):
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    # The step-8 shards are written, then the writer's thread waits (a slow disk); training goes on.
    proc = start(run_dir, ASYNC, env={"TT_TEST_SLOW_SHARDED_SAVE": "2:600"})
    wait_for(lambda: [p for p in checkpoints.glob("step0000008.ckpt.tmp-*") if (p / "__1_0.distcp").exists()], proc, "the step-8 shards", timeout=300)
    wait_for(lambda: any(line.startswith("11 ") for line in batches(run_dir)), proc, "step 11 trained while the step-8 save was in flight", timeout=300)
    assert not (checkpoints / "step0000008.ckpt").exists()
    os.killpg(proc.pid, signal.SIGKILL)
    finish(proc, run_dir)
    left = sorted(p.name for p in checkpoints.iterdir())
    assert left[0] == "step0000004.ckpt" and len(left) == 2 and is_temp(checkpoints / left[1])  # nothing that looks complete
    assert read_state(checkpoints / "step0000004.ckpt")["global_step"] == 4

    proc = start(run_dir, ASYNC)
    out = finish(proc, run_dir)
    assert proc.returncode == 0, out[-3000:]
    assert "resuming from checkpoints/step0000004.ckpt (step 4)" in out and "a checkpoint save that was interrupted" in out
    assert metrics(run_dir) == metrics(reference)  # the async run continues as the synchronous one trained
    assert sorted(p.name for p in checkpoints.iterdir()) == ["final.ckpt", "step0000008.ckpt", "step0000012.ckpt"]  # keep_last=2 prunes folders


def test_sigterm_during_an_async_write_waits_for_it_then_saves(reference, tmp_path):
    run_dir = tmp_path / "run"
    checkpoints = run_dir / "checkpoints"
    # The step-4 save takes 8 s more; its copy into host memory starts 2 s late, while step 5's
    # forward and backward run: step 5's optimizer update must wait for it.
    proc = start(run_dir, ASYNC, env={"TT_TEST_SLOW_SHARDED_SAVE": "1:8", "TT_TEST_SLOW_STAGING": "2"})
    wait_for(lambda: list(checkpoints.glob("step0000004.ckpt.tmp-*")), proc, "the step-4 save", timeout=300)
    proc.send_signal(signal.SIGTERM)  # rank 0; the ranks agree at the next step boundary
    out = finish(proc, run_dir)
    assert proc.returncode == 75, out[-3000:]
    step = int(out.split("SIGTERM at step ")[1].split(":")[0])
    assert 5 <= step < 8
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step0000004.ckpt", f"step{step:07d}.ckpt"]
    assert read_state(checkpoints / f"step{step:07d}.ckpt")["global_step"] == step
    # What the background threads copied and wrote while training went on is what the synchronous
    # run saved at the same step, to the bit: weights and optimizer state (not step 5's).
    ours = dict(flat_tensors(full_state(checkpoints / "step0000004.ckpt")))
    theirs = dict(flat_tensors(full_state(reference / "checkpoints" / "step0000004.ckpt")))
    shared = [k for k in theirs if not k.startswith("tinytrain_save")]
    assert len(shared) > 40 and all(torch.equal(ours[k], theirs[k]) for k in shared)


def is_vocab(key: str) -> bool:
    return "embed_tokens.weight" in key or "lm_head.weight" in key


def test_resume_under_another_tp_re_pads_weights_and_moments(reference, tmp_path):
    """tp 2 x dp 1 (4224 rows) resumed as tp 1 x dp 2 (4160 rows), no step trained: the final checkpoint
    it writes holds every real row of the weights and Adam moments bit-exact, zeros below."""
    run_dir = tmp_path / "tp2"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copytree(reference / "checkpoints" / "step0000012.ckpt", run_dir / "checkpoints" / "step0000012.ckpt")
    proc = start(run_dir, [*RUN, "parallel.tp=1"])
    out = finish(proc, run_dir)
    assert proc.returncode == 0, out[-3000:]
    assert "resuming from checkpoints/step0000012.ckpt (step 12)" in out and "4097 -> 4160 (multiple 64 x tp 1" in out
    before = dict(flat_tensors(full_state(reference / "checkpoints" / "step0000012.ckpt")))
    after = dict(flat_tensors(full_state(run_dir / "checkpoints" / "final.ckpt")))
    compared = [k for k in before if not k.startswith("tinytrain_save")]
    vocab = [k for k in compared if is_vocab(k) and before[k].ndim == 2]
    assert len(vocab) == 6  # embedding and lm_head: weights, exp_avg, exp_avg_sq
    for key in compared:
        if key in vocab:
            assert before[key].shape[0] == 4224 and after[key].shape[0] == 4160, key
            assert torch.equal(after[key][:TRUE_VOCAB], before[key][:TRUE_VOCAB]) and not after[key][TRUE_VOCAB:].any(), key
        else:
            assert torch.equal(after[key], before[key]), key


def test_a_single_process_checkpoint_resumes_under_fsdp_tp_on_two_ranks(tmp_path):
    """The reported crash: a parallel=single checkpoint resumed with parallel=fsdp_tp on 2 ranks
    died on a rank with "The size of tensor a (32) must match the size of tensor b (16)" (Lightning
    rekeyed the optimizer state by the module's parameter order, not the optimizer's)."""
    run_dir = tmp_path / "run"
    single = [a for a in RUN if a not in ("parallel=fsdp_tp", "cluster.devices=2")]
    proc = start(run_dir, [*single, "trainer.max_steps=4"])
    out = finish(proc, run_dir)
    assert proc.returncode == 0, out[-3000:]
    proc = start(run_dir, [*RUN, "trainer.max_steps=6"])
    out = finish(proc, run_dir)
    assert proc.returncode == 0, out[-3000:]
    assert "resuming from checkpoints/step0000004.ckpt (step 4)" in out and "Traceback" not in out
    losses = {int(r["step"]): float(r["loss"]) for r, _ in [(r, None) for r in metrics_rows(run_dir)] if r.get("loss")}
    assert sorted(losses) == [0, 1, 2, 3, 4, 5]  # steps 5 and 6 trained after the resume (rows by 0-based step)
    assert abs(losses[4] - losses[3]) < 0.2  # the loss goes on from where it was (a lost optimizer state would jump)


def test_a_sharded_checkpoint_under_ddp_or_deepspeed_is_refused_in_the_plan(reference, tmp_path):
    from tests.conftest import compose
    from tinytrain.cli import run_stages
    from tinytrain.plan.layout_change import Layout, saved_layout

    folder = reference / "checkpoints" / "step0000012.ckpt"
    assert saved_layout(folder, read_state(folder)) == Layout("sharded", "fsdp_tp", 2, 1, 2)
    base = [a for a in RUN if a not in ("parallel=fsdp_tp", "cluster.devices=2")]
    for run, this in ((["parallel=ddp", "cluster.devices=2"], "this run is ddp full-tensor file"), (["parallel=zero2", "cluster.devices=2", "parallel.deepspeed_on_cpu=true"], "this run is DeepSpeed ZeRO-2 over 2")):
        with pytest.raises(ConfigError) as e:
            run_stages(compose(["mode=plan", *base, *run, f"resume={folder}"]), tmp_path / run[0])
        message = str(e.value)
        assert "saved as fsdp_tp sharded over 2 rank(s) (tp 2 x dp 1)" in message and this in message
        assert "resume with parallel=fsdp_tp (any world size and tp)" in message and f"checkpoint.init_from={folder} without resume={folder}" in message
        assert f"{run[0]} cannot load a sharded fsdp_tp checkpoint" in message  # parallel=zero2, not its strategy's name deepspeed

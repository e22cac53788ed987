"""Preemption and resume through real processes (tests.integration.instrumented_cli.py runs the CLI):

- SIGUSR1 (SIGINT, SIGTERM) mid-run: a checkpoint at the next step boundary, `scontrol requeue`
  under Slurm (SIGUSR1 only), exit 75; `resume=auto` in the same run directory finishes the run, and the result equals an
  uninterrupted run's: loss, lr, grad_norm, loss scale and validation loss to the bit, every batch
  trained exactly once. fp32 on one process (as a Slurm array task), fp16 on two FSDP2 x TP
  processes, and DeepSpeed on two ranks (ZeRO-2 fp32, ZeRO-3 fp16; a checkpoint is a folder of
  shards), with the signal sent to rank 0 only; FSDP2 x TP is stopped by Ctrl-C's SIGINT instead, and
  the fp32 run once more by SIGTERM (scancel, kill).
- The interrupted run checkpoints activations selectively and its resumption in full with compiled
  blocks (aot_eager: dynamo's and AOT autograd's graphs, eager kernels), while the uninterrupted
  reference keeps every activation, eagerly: recomputation and the compiled block change no bit, so
  the modes may change between runs under every strategy (issue 34), FSDP2 x TP at tp 2 among them,
  where a block checkpointed whole has its checkpoint around its compiled forward.
- SIGKILL while a checkpoint is being written (a slow disk): the previous checkpoint still loads,
  the partial file is ignored and removed, and the resumed run again equals the uninterrupted one.
"""

import os
import re
import shutil
import signal
import subprocess
import time
from collections import Counter

import pytest
import torch

from tests.conftest import DEEPSPEED_ON_CPU, SHARED_DATA, compose, metrics_rows, start_cli
from tinytrain.checkpoint.resume import read_state

pytestmark = pytest.mark.slow

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
# 12 steps, checkpoints every 4 (the newest 2 kept), validation every 4, a row of metrics per step.
RUN = ["experiment=smoke", *MODEL, "data.seq_len=32", "trainer.max_steps=12", "trainer.log_every_n_steps=1", "checkpoint.keep_last=2", "trainer.progress_bar=false", "trainer.export=false", "trainer.plot=false"]
VARIANTS = {
    "fp32": [],
    # Two ranks (FSDP2 x TP, tp 2): the signal goes to rank 0 only and the ranks agree at the step
    # boundary. Checkpoints hold 4097 vocab rows, the sharded tables 4224 (64 x tp 2): re-padded on
    # load. The fp16 loss scale starts at 2^4 and doubles every 2 clean steps: a resume that lost
    # the GradScaler's state would show in loss_scale (and in the gradients' rounding).
    "fp16-fsdp_tp": [
        "parallel=fsdp_tp",
        "cluster.devices=2",
        "parallel.tp=2",
        'tokenizer.add_special_tokens=["<|x|>"]',
        "precision=fp16",
        "precision.loss_scale.initial_scale_power=4",
        "precision.loss_scale.window=2",
    ],
    # DeepSpeed's ZeRO-3 checkpoint keeps its client state in zero_pp_rank_0_mp_rank_00_model_states.pt
    # (resume read only ZeRO-1/2's mp_rank_00_model_states.pt once); its fp16 loss scale is DeepSpeed's own.
    "zero2-fp32": ["parallel=zero2", *DEEPSPEED_ON_CPU],
    "zero3-fp16": [
        "parallel=zero3",
        *DEEPSPEED_ON_CPU,
        'tokenizer.add_special_tokens=["<|x|>"]',
        "precision=fp16",
        "precision.loss_scale.initial_scale_power=4",
        "precision.loss_scale.window=2",
    ],
}
# (processes, ranks that train each batch): both tp ranks train the same batch; DeepSpeed's two
# data-parallel ranks train different ones.
RANKS = {"fp32": (1, 1), "fp32-sigterm": (1, 1), "fp16-fsdp_tp": (2, 2), "zero2-fp32": (2, 1), "zero3-fp16": (2, 1)}
# Slurm's SIGUSR1 everywhere but FSDP2 x TP, which gets Ctrl-C's SIGINT, and fp32-sigterm (scancel,
# kill): both stop the same way, without the requeue.
SIGNAL = {"fp32": signal.SIGUSR1, "fp32-sigterm": signal.SIGTERM, "fp16-fsdp_tp": signal.SIGINT, "zero2-fp32": signal.SIGUSR1, "zero3-fp16": signal.SIGUSR1}
# Variants that are the same run as another, stopped by another signal, share its reference.
REFERENCE = {"fp32-sigterm": "fp32"}
COMPARED = ("loss", "lr", "grad_norm", "loss_scale", "val_loss")
# The interrupted run's two halves change the checkpointing mode and compile (the reference runs none, eagerly).
FIRST_HALF = ["trainer.activation_checkpointing=selective"]
SECOND_HALF = ["trainer.activation_checkpointing=full", "trainer.compile=blocks", "trainer.compile_backend=aot_eager"]


def start(run_dir, args, env=None) -> subprocess.Popen:
    return start_cli(args, run_dir, {"TT_TEST_BATCH_LOG": str(run_dir / "batches.txt"), "OMP_NUM_THREADS": "1", **(env or {})}, module="tests.integration.instrumented_cli")


def finish(proc: subprocess.Popen, run_dir, timeout=420) -> str:
    proc.wait(timeout=timeout)
    return (run_dir / "out.log").read_text()


def wait_for(condition, proc: subprocess.Popen, what: str, timeout=180):
    deadline = time.monotonic() + timeout
    while not (found := condition()):
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def batches(run_dir) -> list[str]:
    path = run_dir / "batches.txt"
    return path.read_text().splitlines() if path.exists() else []


def metrics(run_dir) -> list[tuple[str, dict]]:
    """Every logged row (tokens_per_s is a timing, so left out), as the exact strings written."""
    return [(r["step"], {k: r[k] for k in COMPARED if r.get(k)}) for r in metrics_rows(run_dir)]


def slurm_job(tmp_path) -> dict:
    """The environment of a Slurm array task, with an `scontrol` that records how it was called."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    scontrol = bin_dir / "scontrol"
    scontrol.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "scontrol.calls"}\n')
    scontrol.chmod(0o755)
    return {"SLURM_JOB_ID": "4250", "SLURM_ARRAY_JOB_ID": "4240", "SLURM_ARRAY_TASK_ID": "3", "SLURM_JOB_NAME": "pretrain", "PATH": f"{bin_dir}:{os.environ['PATH']}"}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Both reference runs, started at once in the background; `uninterrupted(variant)` waits."""
    root = tmp_path_factory.mktemp("uninterrupted")
    procs = {variant: (root / variant, start(root / variant, [*RUN, *extra])) for variant, extra in VARIANTS.items()}

    def done(variant):
        run_dir, proc = procs[variant]
        out = finish(proc, run_dir)
        assert proc.returncode == 0, out[-3000:]
        return run_dir

    yield done
    for _, proc in procs.values():
        proc.kill()


@pytest.mark.timeout(600)
@pytest.mark.parametrize("variant", [*VARIANTS, *REFERENCE])
def test_a_signal_saves_exits_75_and_the_resumed_run_equals_an_uninterrupted_one(tmp_path, variant, uninterrupted):
    args, (ranks, copies) = [*RUN, *VARIANTS[REFERENCE.get(variant, variant)]], RANKS[variant]
    run_dir = tmp_path / "run"
    slurm = variant == "fp32"  # as task 3 of array job 4240, with a stand-in for scontrol
    proc = start(run_dir, [*args, *FIRST_HALF], env=slurm_job(tmp_path) if slurm else None)
    wait_for(lambda: len(batches(run_dir)) >= 5 * ranks, proc, "step 5")  # every rank logs its batches
    sent = SIGNAL[variant]
    proc.send_signal(sent)  # to rank 0 alone: the ranks agree at the step boundary
    out = finish(proc, run_dir)
    assert proc.returncode == 75, out[-3000:]
    step = int(out.split(f"{sent.name} at step ")[1].split(":")[0])
    assert 5 <= step < 12
    saved = f"checkpoint saved to checkpoints/step{step:07d}.ckpt"
    if slurm:
        assert (tmp_path / "scontrol.calls").read_text() == "requeue 4240_3\n"
        assert f"{saved}; the requeued job resumes from it" in out and "Slurm job 4240_3 requeued" in out
    else:
        assert f"{saved}; resume with the same run directory" in out
    assert f"{sent.name} at step {step}: {saved}" in (run_dir / "tinytrain.log").read_text()  # why it stopped, in the run's log too
    assert not (run_dir / "checkpoints" / "final.ckpt").exists()  # stopped: no final checkpoint, no export
    ckpt = read_state(run_dir / "checkpoints" / f"step{step:07d}.ckpt")  # a file, or DeepSpeed's folder
    assert ckpt["global_step"] == step and len(ckpt["callbacks"]["RNGState"]["ranks"]) == ranks
    assert ckpt["callbacks"]["DataPosition"]["consumed_batches"] == step * (ranks // copies)  # a batch per data-parallel rank a step

    proc = start(run_dir, [*args, *SECOND_HALF])
    out = finish(proc, run_dir)
    assert proc.returncode == 0, out[-3000:]
    assert f"resuming from checkpoints/step{step:07d}.ckpt (step {step})" in out
    assert "activation_checkpointing full" in out and "each transformer block compiled on its own (aot_eager)" in out

    reference = uninterrupted(REFERENCE.get(variant, variant))
    assert metrics(run_dir) == metrics(reference)
    trained, expected = batches(run_dir), batches(reference)
    assert Counter(trained) == Counter(expected) and set(Counter(expected).values()) == {copies}  # each batch once (per tp rank)
    if ranks == 1:
        assert trained == expected  # and in the same order
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["final.ckpt", "step0000008.ckpt", "step0000012.ckpt"]


@pytest.mark.timeout(600)
def test_sigkill_during_a_slow_checkpoint_write_keeps_the_previous_one(tmp_path, uninterrupted):
    run_dir, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    proc = start(run_dir, RUN, env={"TT_TEST_STALL_SAVE": "2"})  # the step-8 save hangs half written
    partial = wait_for(lambda: [p for p in checkpoints.glob("step0000008.ckpt.tmp-*") if p.stat().st_size > 0], proc, "the step-8 save")[0]
    proc.send_signal(signal.SIGKILL)
    finish(proc, run_dir)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step0000004.ckpt", partial.name]
    with pytest.raises(RuntimeError):
        torch.load(partial, weights_only=True)

    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import build_model, hf_config
    from tinytrain.plan.attention import AttentionChoice

    previous = torch.load(checkpoints / "step0000004.ckpt", weights_only=True)
    assert previous["global_step"] == 4
    cfg = compose(RUN)
    tokenizer = load_from_config(cfg.tokenizer)
    model = build_model(cfg.model, hf_config(cfg.model, len(tokenizer), tokenizer), AttentionChoice("sdpa", "test"))
    model.load_state_dict({k.removeprefix("model."): v for k, v in previous["state_dict"].items()}, strict=True)

    proc = start(run_dir, RUN)
    out = finish(proc, run_dir)
    assert proc.returncode == 0, out[-3000:]
    assert f"removed checkpoints/{partial.name}: a checkpoint save that was interrupted" in out
    assert "resuming from checkpoints/step0000004.ckpt (step 4)" in out
    assert not partial.exists()
    reference = uninterrupted("fp32")
    assert metrics(run_dir) == metrics(reference)  # the killed run's rows after step 4 were replaced
    expected = batches(reference)
    assert batches(run_dir) == expected[:8] + expected[4:]  # steps 5-8 trained again after the crash


@pytest.mark.timeout(300)
@pytest.mark.parametrize("val_every", [6, 4], ids=["validating elsewhere", "validating at the save"])
def test_a_signal_during_a_step_s_checkpoint_save_stops_on_that_checkpoint(tmp_path, val_every):
    """The signal came after the step had asked whether to stop: the run trained a step more and
    saved again, the save Slurm's SIGKILL lands in after its KillWait (also where the step validates:
    its checkpoint, after the validation, is the one to stop on)."""
    run_dir, checkpoints = tmp_path / "run", tmp_path / "run" / "checkpoints"
    proc = start(run_dir, [*RUN, f"trainer.val_every_n_steps={val_every}"], env={"TT_TEST_SLOW_SAVE": "3"})
    wait_for(lambda: list(checkpoints.glob("step0000004.ckpt.tmp-*")), proc, "the step-4 save")
    proc.send_signal(signal.SIGTERM)
    out = finish(proc, run_dir)
    assert proc.returncode == 75, out[-3000:]
    assert "SIGTERM at step 4: checkpoint saved to checkpoints/step0000004.ckpt" in out
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step0000004.ckpt"]
    assert [line.split()[0] for line in batches(run_dir)] == [str(s) for s in range(1, 5)]


LAYOUT_RUN = [*RUN, "trainer.max_steps=8", "trainer.val_every_n_steps=4"]


@pytest.fixture(scope="module")
def eight_steps(tmp_path_factory):
    """A run of 8 steps, checkpointed at step 4, in micro batches of 4 without accumulation."""
    first = tmp_path_factory.mktemp("eight_steps")
    out = finish(start(first, LAYOUT_RUN), first)
    assert "step0000004.ckpt" in {p.name for p in (first / "checkpoints").iterdir()}, out[-3000:]
    return first


@pytest.mark.timeout(300)
@pytest.mark.parametrize("change", [["trainer.accumulate_grad_batches=2"], ["trainer.micro_batch_size=2"]])
def test_a_run_resumed_under_another_batch_layout_keeps_its_steps_and_its_data_position(tmp_path, eight_steps, change):
    """Accumulation 1 -> 2: Lightning read its micro-batch count under the new accumulation, so the
    rows were labelled a step low and validation came at step 6, not 8. Micro batch 4 -> 2: the data
    restarted its epoch, training the first 4 steps' samples again. Both continue a step-4
    checkpoint of a run whose rows and samples the resumed run must go on from."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(eight_steps / "checkpoints" / "step0000004.ckpt", run_dir / "checkpoints")
    out = finish(start(run_dir, [*LAYOUT_RUN, *change]), run_dir)
    assert "resuming from checkpoints/step0000004.ckpt (step 4)" in out, out[-3000:]
    changed = "accumulation 1 -> 2, so the global batch 4 -> 8" if "accumulate" in change[0] else "micro batch 4 -> 2, so the global batch 4 -> 2"
    changed += " sequences per step"
    assert f"resume     {changed} since the checkpoint: the schedule continues at step 4, its data continues at the checkpoint's sample" in out
    assert "(first step since the resume at step 4) ->" in out  # this process's steps, not the run's
    rows = metrics_rows(run_dir)
    assert [r["step"] for r in rows if r.get("loss")] == ["4", "5", "6", "7"]
    # The first step is not timed (from a fresh start or a resume); under accumulation it was timed from its second half.
    assert [bool(r.get("tokens_per_s")) for r in rows if r.get("loss")] == [False, True, True, True], rows
    assert [r["step"] for r in rows if r.get("val_loss")] == ["7"]
    assert [r["lr"] for r in rows if r.get("lr")] == [r["lr"] for r in metrics_rows(eight_steps) if r.get("lr")][4:]  # the schedule is the step's
    position = torch.load(run_dir / "checkpoints" / "final.ckpt", weights_only=False)["callbacks"]["DataPosition"]
    per_step = 4 * 2 if "accumulate" in change[0] else 2  # sequences a step after the change
    assert position["consumed_batches"] * position["batch_size"] == 4 * 4 + 4 * per_step
    # evals.csv's tokens seen (callbacks/tokens_seen.py): the first 4 steps at 4 sequences, then the new batch.
    assert torch.load(run_dir / "checkpoints" / "final.ckpt", weights_only=False)["callbacks"]["TokensSeen"] == {"step": 8, "tokens": (4 * 4 + 4 * per_step) * 32}


@pytest.mark.timeout(300)
def test_a_run_resumed_under_another_accumulation_ends_its_epoch_where_its_data_pass_ends(tmp_path):
    """Lightning counted the resumed epoch's micro batches as steps x the new accumulation, ahead of
    the sampler's pass (which continues at the checkpoint's sample): it ended its epoch early and the
    `epoch` column ran one ahead for the rest of the run, the data itself unchanged."""
    text = tmp_path / "small.txt"
    text.write_text((SHARED_DATA / "tinyshakespeare.txt").read_text()[:2000])
    small = [*RUN, "data=text", f"data.path={text}", "trainer.val_every_n_steps=100", "trainer.checkpoint_every_n_steps=2"]
    first = tmp_path / "first"
    out = finish(start(first, [*small, "trainer.max_steps=2", "trainer.warmup_steps=1"]), first)
    windows = int(re.search(r"-> (\d+) windows of 32", out).group(1))
    batches = windows // 4  # global batches of 4 per epoch
    assert batches >= 6, out[-2000:]  # two steps of 2 x 4 left after the checkpoint's 2 batches
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(first / "checkpoints" / "step0000002.ckpt", run_dir / "checkpoints")
    left = (batches - 2) // 2  # steps of 2 micro batches left in the checkpoint's pass
    out = finish(start(run_dir, [*small, "trainer.warmup_steps=1", "trainer.accumulate_grad_batches=2", f"trainer.max_steps={2 + left + 2}"]), run_dir)
    assert "accumulation 1 -> 2" in out, out[-3000:]
    rows = [r for r in metrics_rows(run_dir) if r.get("loss")]
    assert [(r["step"], r["epoch"]) for r in rows] == [(str(2 + i), "0" if i < left else "1") for i in range(left + 2)], rows


@pytest.mark.timeout(300)
def test_rows_after_a_resume_from_a_checkpoint_saved_after_an_off_interval_validation_keep_their_steps(tmp_path, eight_steps):
    """A checkpoint taken after its step's validation held Lightning's row count one low; the resumed
    run added it back only when it validated at that step too. Resumed from step 8 with validation
    every 3 steps (8 is off it), rows were labelled a step low from there on. And the last step, off
    the logging interval (every 2: rows at 10 and the last step, 11), had its row's lr and grad_norm
    copied from the step before."""
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    shutil.copy(eight_steps / "checkpoints" / "step0000008.ckpt", run_dir / "checkpoints")
    out = finish(start(run_dir, [*LAYOUT_RUN, "trainer.max_steps=11", "trainer.val_every_n_steps=3", "trainer.log_every_n_steps=2"]), run_dir)
    assert "resuming from checkpoints/step0000008.ckpt (step 8)" in out, out[-3000:]
    rows = metrics_rows(run_dir)
    train = [r for r in rows if r.get("loss")]
    assert [r["step"] for r in train] == ["9", "10"], rows  # steps 10 and 11 (a row's step is one less)
    assert [r["step"] for r in rows if r.get("val_loss")] == ["8", "10"], rows  # steps 9 and 11
    assert train[1]["lr"] != train[0]["lr"] and train[1]["grad_norm"] != train[0]["grad_norm"], train

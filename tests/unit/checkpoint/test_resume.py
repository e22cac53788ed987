"""`resume`: the newest complete checkpoint (temp files ignored, an unreadable newest skipped),
`never` refusing a directory with checkpoints, an explicit path, and the checks against the run."""

import logging
from pathlib import Path

import pytest
import torch

from tests.conftest import LLAMA2_TOKENIZER, compose, needs_llama2
from tinytrain.checkpoint.resume import leftover_temp_files, set_aside
from tinytrain.errors import ConfigError
from tinytrain.plan.start_points import checkpoint_metadata, resolve_resume
from tinytrain.plan.validate import validate
from tinytrain.plan.vocab import plan_vocab

VOCAB = plan_vocab(4096, 64, 1)
FINGERPRINT = "181f2c58d6466988"


def save(directory, step, vocab=VOCAB, fingerprint=FINGERPRINT, model="tiny"):
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"step{step:07d}.ckpt"
    torch.save({"global_step": step, "tinytrain": checkpoint_metadata(vocab, fingerprint, model), "state_dict": {"model.w": torch.zeros(4096)}}, path)
    return path


def resolve(value, directory, model="tiny"):
    return resolve_resume(value, directory, VOCAB, FINGERPRINT, model)


def test_auto_picks_the_newest_complete_checkpoint(tmp_path):
    save(tmp_path, 4)
    save(tmp_path, 8)
    (tmp_path / "step0000012.ckpt.tmp-4242").write_bytes(b"half a checkpoint")
    point = resolve("auto", tmp_path)
    assert (point.path.name, point.step, point.skipped) == ("step0000008.ckpt", 8, [])
    assert point.describe(tmp_path.parent) == f"resuming from {tmp_path.name}/step0000008.ckpt (step 8)"


def test_auto_without_checkpoints_starts_fresh(tmp_path):
    assert resolve("auto", tmp_path / "checkpoints") is None


def test_an_unreadable_newest_checkpoint_falls_back_to_the_previous(tmp_path, caplog):
    save(tmp_path, 4)
    good = save(tmp_path, 8)
    truncated = tmp_path / "step0000012.ckpt"
    data = good.read_bytes()
    truncated.write_bytes(data[: len(data) // 2])  # a copy cut short
    with caplog.at_level(logging.WARNING):
        point = resolve("auto", tmp_path)
    assert point.step == 8 and [p.name for p, _ in point.skipped] == ["step0000012.ckpt"]
    assert "step0000012.ckpt does not load" in caplog.text
    moved = set_aside(point.skipped)
    assert [p.name for p in moved] == ["step0000012.ckpt.unreadable"] and not truncated.exists()
    assert resolve("auto", tmp_path).step == 8


def test_auto_refuses_to_start_over_when_no_checkpoint_loads(tmp_path):
    (tmp_path / "step0000004.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(ConfigError, match="no step checkpoint in .* loads \\(step0000004.ckpt"):
        resolve("auto", tmp_path)


def test_leftover_temp_files_are_removed(tmp_path):
    save(tmp_path, 4)
    (tmp_path / "step0000008.ckpt.tmp-99").write_bytes(b"x")
    (tmp_path / "step0000008.ckpt.tmp-98").mkdir()  # DeepSpeed's temp folder
    assert sorted(p.name for p in leftover_temp_files(tmp_path)) == ["step0000008.ckpt.tmp-98", "step0000008.ckpt.tmp-99"]
    assert [p.name for p in tmp_path.iterdir()] == ["step0000004.ckpt"]


def test_never_refuses_a_directory_with_checkpoints(tmp_path):
    assert resolve("never", tmp_path) is None
    save(tmp_path, 4)
    with pytest.raises(ConfigError) as e:
        resolve("never", tmp_path)
    text = e.value.render()
    assert "resume='never'" in text and "step0000004.ckpt" in text and "run.name=<new>" in text


def test_an_explicit_path_continues_from_it(tmp_path):
    other = save(tmp_path / "other_run", 20)
    point = resolve(str(other), tmp_path / "this_run")
    assert (point.path, point.step) == (other, 20)


def test_an_explicit_older_checkpoint_refuses_newer_ones_it_would_mix_with(tmp_path):
    old = save(tmp_path, 4)
    save(tmp_path, 8)
    with pytest.raises(ConfigError, match="holds later checkpoints \\(step0000008.ckpt\\)"):
        resolve(str(old), tmp_path)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"fingerprint": "0000000000000000"}, "saved with another tokenizer"),
        ({"model": "tinyllama_1b"}, "saved by model=tinyllama_1b, this run is model=tiny"),
        ({"vocab": plan_vocab(4096, 96, 1)}, "optimizer state cannot be re-padded"),
    ],
)
def test_a_checkpoint_of_another_run_is_refused(tmp_path, kwargs, needle):
    save(tmp_path, 4, **kwargs)
    with pytest.raises(ConfigError) as e:
        resolve("auto", tmp_path)
    assert needle in e.value.render() and "resume=" in e.value.render()


def test_a_missing_resume_path_is_a_config_error():
    with pytest.raises(ConfigError) as e:
        validate(compose(["resume=runs/old/checkpoints/step0000040.ckpt"]))
    text = e.value.render()
    assert "resume='runs/old/checkpoints/step0000040.ckpt'" in text and "resume=auto" in text


def test_keep_last_must_keep_one():
    with pytest.raises(ConfigError, match="checkpoint.keep_last=0"):
        validate(compose(["checkpoint.keep_last=0"]))


@pytest.mark.parametrize(
    "files",
    [
        ["mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"],  # ZeRO-1/2
        ["zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_1_mp_rank_00_model_states.pt"],  # ZeRO-3
    ],
    ids=["zero2", "zero3"],
)
def test_a_deepspeed_folder_resumes_from_its_client_state(tmp_path, files):
    """DeepSpeed writes a folder; rank 0's model-states file holds the step and tinytrain's metadata
    under every ZeRO stage (ZeRO-3 names it per data-parallel rank)."""
    folder = tmp_path / "step0000008.ckpt" / "checkpoint"
    folder.mkdir(parents=True)
    for name in files:
        state = {"global_step": 8, "tinytrain": checkpoint_metadata(VOCAB, FINGERPRINT, "tiny")} if "model_states" in name else {}
        torch.save(state, folder / name)
    point = resolve("auto", tmp_path)
    assert (point.path.name, point.step) == ("step0000008.ckpt", 8)


def test_a_deepspeed_folder_without_client_state_is_named(tmp_path):
    folder = tmp_path / "step0000008.ckpt" / "checkpoint"
    folder.mkdir(parents=True)
    with pytest.raises(ConfigError, match="folder without DeepSpeed checkpoint files"):
        resolve(str(tmp_path / "step0000008.ckpt"), tmp_path)
    torch.save({}, folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    with pytest.raises(ConfigError, match="mp_rank_00_model_states.pt"):
        resolve(str(tmp_path / "step0000008.ckpt"), tmp_path)


def test_a_resume_under_another_batch_layout_says_what_continues():
    from tinytrain.plan.start_points import ResumePoint, batch_change_note, saved_batch

    ckpt = {"callbacks": {"DataPosition": {"batch_size": 4, "consumed_batches": 3}, "AccumulationChange": {"accumulate_grad_batches": 1}}}
    point = ResumePoint(Path("step0000003.ckpt"), 3, "resume=auto", saved_batch=saved_batch(ckpt))
    assert batch_change_note(point, 4, 1, grouped=False) is None
    assert batch_change_note(point, 4, 2, grouped=True) == "accumulation 1 -> 2 since the checkpoint: the schedule continues at step 3, its data continues at the checkpoint's sample"
    assert batch_change_note(point, 2, 1, grouped=True) == "micro batch 4 -> 2 since the checkpoint: the schedule continues at step 3, its data restarts the epoch (data.group_by_length cuts an epoch's batches by their size); validation reads trainer.val_batches micro batches of 2, so val_loss is over other sequences from here"
    # Another data-parallel size: the global batch it makes is said.
    two_ranks = ResumePoint(Path("step0000003.ckpt"), 3, "resume=auto", saved_batch=saved_batch(ckpt), saved_data_parallel=2)
    assert batch_change_note(two_ranks, 4, 1, grouped=False, data_parallel=1) == "data parallel 2 -> 1, so the global batch 8 -> 4 sequences per step since the checkpoint: the schedule continues at step 3, its data continues at the checkpoint's sample"
    assert batch_change_note(two_ranks, 4, 2, grouped=False, data_parallel=1) == "accumulation 1 -> 2, data parallel 2 -> 1 since the checkpoint: the schedule continues at step 3, its data continues at the checkpoint's sample"
    ramp = {"callbacks": {"DataPosition": {"batch_size": 4, "ramp": [8, 32]}}}  # a ramp's batch_size is no micro batch; no accumulation recorded
    assert batch_change_note(ResumePoint(Path("x"), 3, "resume=auto", saved_batch=saved_batch(ramp)), 2, 2, grouped=False) is None


def test_a_resume_under_another_schedule_in_the_same_stage_says_the_rate_s_jump():
    """A finished cosine run of 200 steps continued to 250: its next rate was the decay's floor, this
    schedule's at the same position is well above it."""
    from tests.conftest import compose
    from tinytrain.plan.schedule import from_trainer
    from tinytrain.plan.start_points import ResumePoint, rate_change_note

    def saved_at(t, step):
        return {"schedule_step": step, "lr": t.lr * from_trainer(t).multiplier(step)}

    old = compose(["trainer.max_steps=200", "trainer.warmup_steps=20"]).trainer
    point = ResumePoint(Path("step0000200.ckpt"), 200, "resume=auto", saved_rate=saved_at(old, 200))
    assert rate_change_note(point, from_trainer(old), old.lr) is None
    longer = compose(["trainer.max_steps=250", "trainer.warmup_steps=20"]).trainer
    note = rate_change_note(point, from_trainer(longer), longer.lr)
    assert note.startswith("the rate at step 200: 3.000e-04 -> ") and "the checkpoint's own settings continue without one" in note, note
    assert rate_change_note(ResumePoint(Path("x"), 200, "resume=auto"), from_trainer(longer), longer.lr) is None  # not recorded


def test_a_resume_in_other_numerics_says_so():
    """fp8 turned off (or bf16 -> fp16) on resume was accepted without a word; it is allowed (the
    checkpoint holds full-precision weights and moments) and now named in the plan."""
    from tinytrain.plan.start_points import ResumePoint, numerics_change_note

    point = ResumePoint(Path("step0000003.ckpt"), 3, "resume=auto", saved_numerics={"precision": "bf16-mixed", "fp8": True})
    assert numerics_change_note(point, "bf16-mixed", True) is None
    assert numerics_change_note(point, "16-mixed", False) == "precision bf16-mixed -> 16-mixed, fp8 on -> off since the checkpoint: the weights and optimizer state carry over; the loss may move at the change"
    assert numerics_change_note(ResumePoint(Path("x"), 3, "resume=auto"), "16-mixed", False) is None  # saved before it was recorded


def test_checkpoints_record_their_numerics_and_a_resume_reads_them(tmp_path):
    from tests.conftest import compose
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.plan.planner import make_plan

    cfg = compose(["precision=fp16"])
    run_dir = tmp_path / "run"
    plan = make_plan(cfg, load_from_config(cfg.tokenizer), run_dir)
    meta = plan.checkpoint_metadata()
    assert meta["numerics"] == {"precision": "16-mixed", "fp8": False}
    (run_dir / "checkpoints").mkdir(parents=True)
    torch.save({"global_step": 3, "tinytrain": meta, "state_dict": {}}, run_dir / "checkpoints" / "step0000003.ckpt")
    resumed = make_plan(compose(["precision=fp32"]), load_from_config(cfg.tokenizer), run_dir)
    assert resumed.resume.numerics_change.startswith("precision 16-mixed -> 32-true since the checkpoint")


def test_a_resume_under_other_adapters_is_refused():
    from types import SimpleNamespace

    from tinytrain.plan.start_points import ResumePoint, finetune_change_problem

    lora = {"method": "lora", "rank": 8, "alpha": 32.0, "dropout": 0.0, "target_modules": ["q_proj", "v_proj"], "trainable_token_ids": [4096]}
    adapters = lambda **changed: SimpleNamespace(to_dict=lambda: {**lora, **changed})  # noqa: E731
    point = ResumePoint(Path("step0000003.ckpt"), 3, "resume=auto", saved_finetune=lora)
    assert finetune_change_problem(point, adapters(dropout=0.1, target_modules=["v_proj", "q_proj"])) is None  # dropout and order change nothing held
    assert "finetune.target_modules=['q_proj', 'v_proj']" in finetune_change_problem(point, adapters(target_modules=["q_proj"])).message
    assert "was trained with finetune=lora, this run full training" in finetune_change_problem(point, None).message
    full = ResumePoint(Path("step0000003.ckpt"), 3, "resume=auto")
    assert finetune_change_problem(full, None) is None
    problem = finetune_change_problem(full, adapters())
    assert "was trained with full training, this run finetune=lora" in problem.message and "checkpoint.init_from" in problem.fix


def test_the_plan_says_init_from_is_not_applied_when_the_run_resumes(tmp_path):
    """Both given (a requeued fine-tune): the plan printed the init_from re-padding as if it applied."""
    from tests.conftest import compose
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.plan.planner import make_plan

    cfg = compose([])
    tokenizer = load_from_config(cfg.tokenizer)
    meta = make_plan(cfg, tokenizer, tmp_path / "first").checkpoint_metadata()
    base = tmp_path / "base.ckpt"
    torch.save({"global_step": 8, "tinytrain": meta, "state_dict": {}}, base)
    run_dir = tmp_path / "run"
    (run_dir / "checkpoints").mkdir(parents=True)
    torch.save({"global_step": 3, "tinytrain": meta, "state_dict": {}}, run_dir / "checkpoints" / "step0000003.ckpt")
    text = make_plan(compose([f"checkpoint.init_from={base}"]), tokenizer, run_dir).render()
    assert f"init from  {base}: not applied, the run resumes from its own checkpoint" in text


@pytest.mark.parametrize("given", [".", "checkpoints"])
def test_a_run_directory_given_for_a_checkpoint_names_its_newest(tmp_path, given):
    """resume=<run dir> was told to point at a folder saved under parallel=zero*, whatever the run."""
    (tmp_path / "checkpoints").mkdir()
    for step in (4, 8):
        (tmp_path / "checkpoints" / f"step000000{step}.ckpt").write_bytes(b"weights")
    with pytest.raises(ConfigError) as e:
        resolve(str(tmp_path / given), tmp_path / "other")
    problem = e.value.problems[0]
    assert "is a folder of step checkpoints, not one checkpoint" in problem.message
    assert f"resume={tmp_path / 'checkpoints' / 'step0000008.ckpt'}, the newest" in problem.fix


def test_a_checkpoint_from_before_the_rate_was_recorded_says_so():
    """An older tinytrain's checkpoint has no rate: a schedule changed since was resumed silently."""
    from tinytrain.plan.start_points import ResumePoint, rate_change_note

    old = ResumePoint(Path("step0000010.ckpt"), 10, "resume=auto", saved_metadata_version=0)
    assert "saved by an older tinytrain, before checkpoints recorded their rate" in rate_change_note(old, None, 3e-3)
    unscheduled = ResumePoint(Path("step0000010.ckpt"), 10, "resume=auto")  # this version's, saved without a scheduler
    assert rate_change_note(unscheduled, None, 3e-3) is None


# What tinytrain wrote for ../shared/data/llama2-tokenizer before it encoded the file exactly as
# sentencepiece does (computed with the code of the commit before that change).
LLAMA2_PRE_EXACT_FINGERPRINT = "bf49beb719bed670"


@needs_llama2
def test_a_llama2_checkpoint_from_before_the_exact_encoding_resumes_and_exports(tmp_path):
    """Refused as "another tokenizer", with the fix "resume with the tokenizer it was trained with":
    the same file, which could never pass."""
    from omegaconf import OmegaConf

    from tinytrain.data.tokenizer import earlier_fingerprints, load_from_config
    from tinytrain.outputs.saved_run import load
    from tinytrain.plan.planner import make_plan

    overrides = ["tokenizer=llama2", f"tokenizer.path={LLAMA2_TOKENIZER.parent}"]
    cfg = compose(overrides)
    tokenizer = load_from_config(cfg.tokenizer)
    assert list(earlier_fingerprints(tokenizer)) == [LLAMA2_PRE_EXACT_FINGERPRINT]
    run_dir = tmp_path / "run"
    meta = make_plan(cfg, tokenizer, tmp_path / "first").checkpoint_metadata()
    old = {**meta, "tokenizer_fingerprint": LLAMA2_PRE_EXACT_FINGERPRINT}
    (run_dir / "checkpoints").mkdir(parents=True)
    checkpoint = run_dir / "checkpoints" / "step0000003.ckpt"
    torch.save({"global_step": 3, "tinytrain": old, "state_dict": {}}, checkpoint)
    text = make_plan(cfg, tokenizer, run_dir).render()
    assert "resume     it was saved by a tinytrain from before the exact SentencePiece encoding of this tokenizer.model" in text
    base = tmp_path / "base.ckpt"
    torch.save({"global_step": 3, "tinytrain": old, "state_dict": {}}, base)
    started = make_plan(compose([*overrides, f"checkpoint.init_from={base}"]), tokenizer, tmp_path / "new")
    assert started.init_from.tokenizer_change and "init from  it was saved by a tinytrain from before" in started.render()
    OmegaConf.save(OmegaConf.to_container(cfg, resolve=True), run_dir / "config_resolved.yaml")  # as training writes it
    assert load(str(checkpoint), tmp_path).tokenizer is not None  # mode=export|eval|generate read it
    # Any other fingerprint is still another tokenizer.
    torch.save({"global_step": 3, "tinytrain": {**meta, "tokenizer_fingerprint": "0000000000000000"}, "state_dict": {}}, checkpoint)
    for refused in (lambda: make_plan(cfg, tokenizer, run_dir), lambda: load(str(checkpoint), tmp_path)):
        with pytest.raises(ConfigError, match="another tokenizer|was saved with tokenizer 0000000000000000"):
            refused()


@pytest.mark.parametrize(
    "content, needle",
    [
        ({"tinytrain": ["not", "a", "table"]}, "its tinytrain metadata is a list"),
        ({"tinytrain": {k: v for k, v in checkpoint_metadata(VOCAB, FINGERPRINT, "tiny").items() if k != "tokenizer_fingerprint"}}, "tokenizer_fingerprint missing"),
        ({"tinytrain": {**checkpoint_metadata(VOCAB, FINGERPRINT, "tiny"), "true_vocab": "4096"}}, "true_vocab '4096'"),
        ({"tinytrain": checkpoint_metadata(VOCAB, FINGERPRINT, "tiny"), "state_dict": ["w"]}, "state_dict a list"),
        ({"tinytrain": checkpoint_metadata(VOCAB, FINGERPRINT, "tiny"), "state_dict": {"model.model.norm.weight": torch.ones(64)}}, "holds no embedding table"),
    ],
    ids=["metadata a list", "no fingerprint", "vocab a string", "weights a list", "no embedding"],
)
def test_a_checkpoint_with_malformed_metadata_is_named_in_the_plan(tmp_path, content, needle):
    """From elsewhere: each failed as an AttributeError, KeyError or TypeError, some once training
    had started (init_from's plan said preflight ok)."""
    from tinytrain.plan.model_shape import shape_from_config
    from tinytrain.plan.start_points import init_point

    path = tmp_path / "step0000004.ckpt"
    torch.save({"global_step": 4, "state_dict": {}, **content}, path)
    shape = shape_from_config(compose([]).model, VOCAB.padded)
    for read in (lambda: resolve_resume(str(path), tmp_path, VOCAB, FINGERPRINT, "tiny", shape), lambda: init_point(str(path), VOCAB, FINGERPRINT, False, shape)):
        with pytest.raises(ConfigError, match=needle):
            read()

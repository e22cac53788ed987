"""Real CPU training through `python -m tinytrain`: outputs, fp16 loss scaling, DDP over gloo."""


import pytest
import torch

from tests.conftest import LEVERS, assert_checkpoint_size_estimated, logged, run_cli

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("smoke") / "run"
    r = run_cli(["experiment=smoke", "trainer.progress_bar=false", 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]'], run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return run_dir, r


def test_run_directory_holds_every_output(smoke_run):
    run_dir, _ = smoke_run
    for name in ("config_resolved.yaml", "plan.json", "metrics.csv", "loss_curve.png", "checkpoints/final.ckpt", "checkpoints/step0000008.ckpt", "hf_export/config.json", "hf_export/tokenizer.json"):
        assert (run_dir / name).exists(), name
    assert (run_dir / "loss_curve.png").read_bytes()[:4] == b"\x89PNG"


def test_metrics_are_logged(smoke_run):
    run_dir = smoke_run[0]
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "val_loss"):
        assert logged(run_dir, key), key
    assert max(logged(run_dir, "lr")) <= 3e-3 * (1 + 1e-6)  # logged as float32


def test_checkpoint_records_vocab_metadata(smoke_run):
    ckpt = torch.load(smoke_run[0] / "checkpoints" / "final.ckpt", map_location="cpu", weights_only=False)
    meta = ckpt["tinytrain"]
    assert (meta["true_vocab"], meta["padded_vocab"], meta["vocab_multiple"], meta["tp"]) == (4098, 4160, 64, 1)
    assert len(meta["tokenizer_fingerprint"]) == 16
    # stored gathered and unpadded: exactly len(tokenizer) rows, re-padded by whoever loads it
    assert ckpt["state_dict"]["model.model.embed_tokens.weight"].shape[0] == 4098
    assert ckpt["state_dict"]["model.lm_head.weight"].shape[0] == 4098


def test_export_has_true_vocab_rows(smoke_run):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smoke_run[0] / "hf_export")
    assert model.config.vocab_size == 4098
    assert model.get_input_embeddings().weight.shape[0] == 4098


def test_summary_prints_first_and_last_loss(smoke_run):
    assert "(first step) ->" in smoke_run[1].stdout
    assert "tokens/s per device after the first step; MFU omitted: no tensor-core peak for a CPU" in smoke_run[1].stdout
    assert "first optimizer step done" in smoke_run[1].stdout + smoke_run[1].stderr
    assert "vocab      4098 -> 4160" in smoke_run[1].stdout
    # 8 steps: the means of the first and last 2, beside the single batches.
    assert "loss mean of the first 2 step(s) " in smoke_run[1].stdout and "(one batch's loss is noisy: compare these)" in smoke_run[1].stdout


def test_lightning_is_told_each_batch_size(smoke_run):
    """self.log gets the batch's rows: Lightning no longer guesses them from the batch dict."""
    assert "Trying to infer the `batch_size`" not in smoke_run[1].stdout + smoke_run[1].stderr


def test_fp16_on_cpu_runs_real_loss_scaling(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(["experiment=smoke", "precision=fp16", "precision.loss_scale.initial_scale_power=10", "trainer.progress_bar=false"], run_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "precision  16-mixed" in r.stdout
    assert_checkpoint_size_estimated(run_dir)  # single, fp16: plan.json's estimate within 10%
    ckpt = torch.load(run_dir / "checkpoints" / "final.ckpt", map_location="cpu", weights_only=False)
    # Lightning stores the GradScaler's state only when the fp16 plugin (not bf16) trained.
    scaler = ckpt["MixedPrecision"]
    assert scaler["scale"] <= 2.0**10 and scaler["growth_interval"] == 1000


def test_ddp_two_processes_over_gloo(tmp_path):
    """Two ranks over gloo, not on a terminal (as under Slurm): each log line once, from rank 0, on
    the console and in tinytrain.log, and progress as plain lines instead of a carriage-return bar."""
    run_dir = tmp_path / "run"
    r = run_cli(["experiment=smoke", "parallel=ddp", "cluster.devices=2", *LEVERS], run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "world size 2 = tp 1 x dp 2" in r.stdout
    assert "fast paths compile blocks, activation_checkpointing selective" in r.stdout
    assert_checkpoint_size_estimated(run_dir)
    assert (run_dir / "hf_export" / "config.json").exists()
    assert len(logged(run_dir, "loss")) > 0
    log = (run_dir / "tinytrain.log").read_text()
    assert [p.name for p in run_dir.glob("*.log")] == ["tinytrain.log"]  # not one file per rank
    for text in (log, r.stdout, r.stderr):
        assert "\r" not in text
    messages = [line.split(" - ", 1)[1] for line in log.splitlines() if " - " in line]
    assert messages and len(messages) == len(set(messages)), log
    assert not [line for line in log.splitlines() if "[rank 1]" in line and "[INFO]" in line]
    progress = [m for m in messages if m.startswith("step ")]
    assert [m.split(":")[0] for m in progress] == ["step 2/8", "step 4/8", "step 6/8", "step 8/8"], log
    # The log keeps what the console showed of the plan and the summary (a Slurm job's console is elsewhere).
    for shown in ("parallel   ddp: world size 2 = tp 1 x dp 2", "preflight  ok", "(first step) -> ", f"run directory: {run_dir}"):
        assert shown in log and shown in r.stdout, shown
    console = r.stdout.splitlines()
    for message in messages:
        assert sum(message in line for line in console) == 1, (message, r.stdout)


def test_lean_paths_train_the_same(smoke_run, tmp_path):
    """Chunked cross-entropy from hidden states + selective activation checkpointing + compiled
    blocks: same losses; trainer.profile traces steps 2-3 and names the top costs."""
    run_dir = tmp_path / "run"
    r = run_cli(["experiment=smoke", "trainer.progress_bar=false", 'tokenizer.add_special_tokens=["<|im_start|>","<|im_end|>"]', "trainer.loss_chunk_tokens=48", *LEVERS, "trainer.profile=true", "trainer.profile_start=2", "trainer.profile_steps=2"], run_dir)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "chunked loss (48 tokens)" in r.stdout
    assert f"profile of steps 2-3 in {run_dir / 'profile'}: top costs by self time, as shares of all ops' self time (profile/top_ops_rank0.txt's % also counts its ProfilerStep rows) " in r.stdout
    assert len(list((run_dir / "profile").glob("rank0.*.pt.trace.json"))) == 1
    # The run's rate leaves out the traced steps (and any a block was compiled again in).
    throughput = next(line for line in r.stdout.splitlines() if line.startswith("throughput "))
    assert "steps left out: " in throughput and " profiling)" in throughput, throughput
    ours, base = logged(run_dir, "loss"), logged(smoke_run[0], "loss")
    assert len(ours) == len(base) > 0
    assert ours == pytest.approx(base, rel=1e-4)


def test_compiled_blocks_compile_once_whatever_the_depth(tmp_path):
    """Ten compiled blocks share one graph: torch's recompile log shows at most a recompile or two
    (validation's inputs), never the recompile limit (8), after which dynamo runs the deeper blocks
    eagerly. The non-finite guard's forward-order hooks ran inside every block's graph and made
    dynamo compile each block anew on its name (callbacks/nonfinite_guard.py; without checkpointing:
    inside a checkpointed block they broke the first step's graph instead)."""
    model = ["model.num_layers=10", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
    r = run_cli(["experiment=smoke", *model, "trainer.max_steps=3", "trainer.warmup_steps=1", "trainer.progress_bar=false", "generate.sample_prompts=[]", "trainer.compile=blocks", "trainer.compile_backend=aot_eager"], tmp_path / "run", env={"TORCH_LOGS": "recompiles"})
    assert r.returncode == 0, r.stderr[-3000:]
    log = r.stdout + r.stderr
    assert log.count("Recompiling function") <= 2 and "recompile_limit" not in log, log[-3000:]


def test_a_run_shorter_than_the_log_interval_writes_metrics_and_the_curve(tmp_path):
    run_dir = tmp_path / "run"
    r = run_cli(["experiment=smoke", "trainer.max_steps=3", "trainer.warmup_steps=1", "trainer.log_every_n_steps=50", "trainer.progress_bar=false", "generate.sample_prompts=[]"], run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert len(logged(run_dir, "loss")) == 1 and (run_dir / "loss_curve.png").is_file()



def test_the_last_step_validates_and_a_finished_run_reports_it_again(tmp_path):
    """6 steps, validation every 4: the final val_loss was step 4's (the summary, result.json and a
    sweep's ranking took it), and a rerun of the finished run reported none, overwriting its
    sweep result with null."""

    from tests.conftest import metrics_rows

    run_dir = tmp_path / "run"
    args = ["experiment=smoke", "trainer.max_steps=6", "trainer.checkpoint_every_n_steps=2", "trainer.progress_bar=false", "trainer.plot=false", "trainer.export=false", "generate.sample_prompts=[]"]
    r = run_cli(args, run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    validated = [(int(row["step"]) + 1, float(row["val_loss"])) for row in metrics_rows(run_dir) if row.get("val_loss")]
    assert [step for step, _ in validated] == [4, 6]
    assert f"validation {validated[-1][1]:.4f} (step 6)" in r.stdout
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["final.ckpt", "step0000002.ckpt", "step0000004.ckpt", "step0000006.ckpt"]
    r = run_cli(args, run_dir)  # resumes from step 6: nothing to train, the run's result again
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"no step left to train (trainer.max_steps=6), validation {validated[-1][1]:.4f} (step 6)" in r.stdout
    assert [(int(row["step"]) + 1, float(row["val_loss"])) for row in metrics_rows(run_dir) if row.get("val_loss")] == validated


def test_a_step_s_logged_loss_is_the_mean_of_its_micro_batches(tmp_path):
    """Under accumulation metrics.csv's loss was the step's last micro batch's (Lightning keeps the
    last value a step logs), not the step's: the mean of its micro batches' losses, as the backward
    weighs them. With every label trained (predict_across_documents) rows carry equal token counts,
    so 4 sequences as 2 micro batches of 2 give one micro batch of 4's loss, at every step (a small
    rate keeps the two runs' rounding from growing through Adam's updates)."""
    args = ["experiment=smoke", "data.seq_len=32", "data.predict_across_documents=true", "trainer.global_batch_size=4", "trainer.max_steps=3", "trainer.warmup_steps=0", "trainer.lr=1e-6", "trainer.log_every_n_steps=1", "trainer.val_batches=0", "trainer.plot=false", "trainer.export=false"]
    losses = {}
    for micro in (4, 2):
        r = run_cli([*args, f"trainer.micro_batch_size={micro}"], tmp_path / str(micro))
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        losses[micro] = logged(tmp_path / str(micro), "loss")
    assert len(losses[2]) == 3 and losses[2] == pytest.approx(losses[4], rel=1e-5), losses
    # The progress lines (no terminal here) too: one per step, with the step's loss (the first micro batch of the run
    # printed a line "step 0/3" with its own loss).
    progress = [line.split(" - ", 1)[1] for line in (tmp_path / "2" / "tinytrain.log").read_text().splitlines() if " - step " in line]
    assert [p.split(":")[0] for p in progress] == ["step 1/3", "step 2/3", "step 3/3"], progress
    assert [float(p.split("loss ")[1].split(",")[0]) for p in progress] == pytest.approx(losses[2], abs=1e-4)

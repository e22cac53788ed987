"""parallel=zero* for real: Lightning's DeepSpeedStrategy trains two ranks over gloo on DeepSpeed's
CPU accelerator (parallel.deepspeed_on_cpu=true lifts Lightning's CUDA-only checks, nothing else),
through the same tinytrain code a GPU run uses: generated config, strategy, atomic shard-folder
saves, consolidation and export.

Preemption and resume under DeepSpeed are in test_resume.py, the Yi-6B failure through DeepSpeed
fp16 in test_yi_like.py.
"""

import json
import threading
import time

import pytest
import torch

from tests.conftest import DEEPSPEED_ON_CPU, LEVERS, assert_checkpoint_size_estimated, compose, logged, run_cli
from tinytrain.checkpoint.resume import read_state

pytestmark = pytest.mark.slow

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
# 4097 tokens (one added) in tables padded to 4160: the export must unpad.
RUN = [
    "experiment=smoke",
    *MODEL,
    'tokenizer.add_special_tokens=["<|x|>"]',
    "data.seq_len=32",
    "trainer.log_every_n_steps=1",
    "trainer.lr=1e-2",
    "trainer.progress_bar=false",
    "trainer.plot=false",
    # fp32 weights in every variant, so the export is compared with the consolidated fp32 state
    # to 1e-5 (export.dtype=auto, the training precision, is tests/unit/test_export_chat.py's).
    "export.dtype=fp32",
    *DEEPSPEED_ON_CPU,
]
TRUE_VOCAB = 4097
# fp16 starts at 2^8 and may double every 2 clean steps: the scale DeepSpeed reports must follow it.
FP16 = ["precision=fp16", "precision.loss_scale.initial_scale_power=8", "precision.loss_scale.window=2"]


class FolderWatcher:
    """Records, for each checkpoint that appears in a folder, whether it was complete when first
    seen: DeepSpeed's `latest` tag file and every rank's optimizer partition in place."""

    def __init__(self, folder, ranks: int = 2):
        self.folder, self.ranks = folder, ranks
        self.first_seen: dict[str, bool] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def complete(self, path) -> bool:
        return (path / "latest").is_file() and len(list(path.glob("checkpoint/*optim_states.pt"))) == self.ranks

    def _watch(self):
        while not self._stop.is_set():
            if self.folder.is_dir():
                for path in self.folder.iterdir():
                    if path.name.endswith(".ckpt") and path.is_dir() and path.name not in self.first_seen:
                        self.first_seen[path.name] = self.complete(path)
            time.sleep(0.005)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def hf_logits_equal_consolidated(run_dir) -> None:
    """The export reloads in plain transformers with exactly len(tokenizer) rows, and its logits
    are those of the consolidated (padded) weights over the true vocab."""
    from transformers import AutoModelForCausalLM

    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.model.build import build_model, hf_config
    from tinytrain.plan.attention import AttentionChoice

    exported = AutoModelForCausalLM.from_pretrained(run_dir / "hf_export")
    assert exported.config.vocab_size == TRUE_VOCAB
    assert exported.get_input_embeddings().weight.shape[0] == exported.get_output_embeddings().weight.shape[0] == TRUE_VOCAB

    cfg = compose(RUN)
    tokenizer = load_from_config(cfg.tokenizer)
    consolidated = torch.load(run_dir / "checkpoints" / "final.consolidated.ckpt", map_location="cpu", weights_only=False)
    state = {k.removeprefix("model."): v for k, v in consolidated["state_dict"].items()}
    padded = state["model.embed_tokens.weight"].shape[0]
    assert padded == 4160 and consolidated["tinytrain"]["true_vocab"] == TRUE_VOCAB
    model = build_model(cfg.model, hf_config(cfg.model, padded, tokenizer), AttentionChoice("sdpa", "test"))
    model.load_state_dict(state, strict=True)
    ids = torch.tensor([tokenizer.encode("def main():\n    return 0")])
    with torch.no_grad():
        ours = model(input_ids=ids).logits[..., :TRUE_VOCAB]
        theirs = exported(input_ids=ids).logits
    # Not bit-equal: a matmul over 4097 output rows blocks its sums differently from one over 4160.
    torch.testing.assert_close(theirs, ours, rtol=1e-5, atol=1e-5)


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "option, extra",
    [
        ("zero1", []),
        ("zero2", []),
        ("zero3", LEVERS),  # selective checkpointing and compiled blocks around ZeRO-3's gathers
        ("zero2_offload", []),
        ("zero3_offload", []),
        ("zero2", FP16),  # ZeRO-3 in fp16 trains and resumes exactly in tests/integration/test_resume.py
        ("zero3", ["precision=bf16"]),  # the A800 path: DeepSpeed's bf16 block (torch's CPU bf16 kernels)
    ],
    ids=["zero1", "zero2", "zero3", "zero2_offload", "zero3_offload", "zero2-fp16", "zero3-bf16"],
)
def test_trains_saves_atomically_consolidates_and_exports(option, extra, tmp_path):
    run_dir = tmp_path / "run"
    with FolderWatcher(run_dir / "checkpoints") as watcher:
        r = run_cli([*RUN, f"parallel={option}", *extra], run_dir)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]

    assert "written to deepspeed_config.json (on DeepSpeed's CPU accelerator: parallel.deepspeed_on_cpu, for tests only)" in r.stdout
    assert "gcc" not in r.stdout + r.stderr  # DeepSpeed's op builder probes stay out of the log
    losses = logged(run_dir, "loss")
    assert len(losses) == 8 and losses[-1] < losses[0] - 0.5, losses
    # Each checkpoint folder appeared complete (renamed into place after every rank wrote its part).
    assert watcher.first_seen == {"step0000004.ckpt": True, "step0000008.ckpt": True, "final.ckpt": True}
    assert not [p.name for p in (run_dir / "checkpoints").iterdir() if ".tmp-" in p.name]
    for name in watcher.first_seen:  # each shard passes the no-pickled-code check resume makes (safe_load.py)
        assert read_state(run_dir / "checkpoints" / name)["tinytrain"]["true_vocab"] == TRUE_VOCAB

    assert_checkpoint_size_estimated(run_dir)  # plan.json's size of a step checkpoint, within 10%
    ran = json.loads((run_dir / "deepspeed_config.json").read_text())
    stage = int(option[4])
    assert ran["zero_optimization"]["stage"] == stage and ran["gradient_accumulation_steps"] == 1
    assert ("offload_optimizer" in ran["zero_optimization"]) == option.endswith("offload")
    scales = logged(run_dir, "loss_scale")
    assert ("bf16" in ran) == ("precision=bf16" in extra) and ("fp16" in ran) == (extra == FP16)
    if extra == FP16:
        # DeepSpeed's own scale, following tinytrain's policy: it starts at 2^8 and only ever
        # doubles or halves (no clean window of 2 steps passes without doubling).
        assert ran["fp16"]["initial_scale_power"] == 8 and ran["fp16"]["loss_scale_window"] == 2
        assert len(scales) == 8 and scales[0] <= 2.0**8 and max(scales) > 2.0**8, scales
        assert all(b in (a / 2, a, a * 2) for a, b in zip(scales, scales[1:])), scales
    else:
        assert scales == []  # no loss scaling under fp32/bf16: no loss_scale values (DeepSpeed's static 1.0 is not one)
    hf_logits_equal_consolidated(run_dir)
    if option == "zero3" and extra == LEVERS:
        export_step_folder(run_dir, tmp_path)


def test_compiled_layers_under_zero3_compile_once_and_train_as_eager(tmp_path):
    """Ten layers under ZeRO-3 with selective checkpointing: the compiled blocks run with no graph
    break and at most two recompiles a rank (validation's inputs), and every step's loss and gradient
    norm equal the eager run's. Before each layer gathered its weights whole (model/zero3_layers.py),
    DeepSpeed's gathers inside a layer broke its graph, its hooks recompiled it per layer up to
    torch's limit, and the op policy could not replay its recompute."""
    ten = ["model.num_layers=10", "trainer.max_steps=4", "trainer.warmup_steps=1", "trainer.export=false", "trainer.checkpoint_every_n_steps=100", "trainer.val_every_n_steps=100", "parallel=zero3", "trainer.activation_checkpointing=selective"]
    compiled = run_cli([*RUN, *ten, "trainer.compile=blocks", "trainer.compile_backend=aot_eager"], tmp_path / "compiled", env={"TORCH_LOGS": "recompiles,graph_breaks"})
    assert compiled.returncode == 0, compiled.stdout[-3000:] + compiled.stderr[-3000:]
    log = compiled.stdout + compiled.stderr
    assert "Graph break" not in log and "recompile_limit" not in log, log[-3000:]
    for rank in (0, 1):
        assert sum(f"[rank{rank}]" in line and "Recompiling function" in line for line in log.splitlines()) <= 2, log[-3000:]
    eager = run_cli([*RUN, *ten, "trainer.compile=none"], tmp_path / "eager")
    assert eager.returncode == 0, eager.stdout[-3000:] + eager.stderr[-3000:]
    for metric in ("loss", "grad_norm"):
        ours, base = logged(tmp_path / "compiled", metric), logged(tmp_path / "eager", metric)
        assert len(ours) == len(base) == 4 and ours == pytest.approx(base, rel=1e-6), (metric, ours, base)


def export_step_folder(run_dir, tmp_path) -> None:
    """mode=export of a DeepSpeed step checkpoint folder (ZeRO-3: parameters partitioned) equals
    the folder consolidated by DeepSpeed's own converter."""
    from lightning.pytorch.utilities.deepspeed import (
        convert_zero_checkpoint_to_fp32_state_dict,
    )

    from tests.integration.export_checks import (
        assert_export_matches,
        checkpoint_weights,
    )

    step = run_dir / "checkpoints" / "step0000004.ckpt"
    r = run_cli(["mode=export", f"checkpoint={step}", f"export.dir={tmp_path / 'step4'}"], tmp_path / "export")
    assert r.returncode == 0, r.stderr[-3000:]
    convert_zero_checkpoint_to_fp32_state_dict(str(step), str(tmp_path / "step4.ckpt"))
    assert_export_matches(tmp_path / "step4", checkpoint_weights(tmp_path / "step4.ckpt"), RUN, TRUE_VOCAB)
    # mode=average of two copies of the folder: its weights back, without the padding rows.
    r = run_cli(["mode=average", f"checkpoints=[{step},{step}]", f"export.dir={tmp_path / 'average'}"], tmp_path / "average-cli")
    assert r.returncode == 0, r.stderr[-3000:]
    mean, consolidated = checkpoint_weights(run_dir / "checkpoints" / "average-k2-step0000004.ckpt"), checkpoint_weights(tmp_path / "step4.ckpt")
    assert mean.keys() == consolidated.keys() and all(torch.equal(v, consolidated[k][: v.shape[0]]) for k, v in mean.items())


@pytest.mark.timeout(600)
def test_chunked_loss_under_zero3_uses_the_gathered_lm_head(tmp_path):
    """A vocab padded to 65536 turns the chunked loss on; it reads lm_head.weight outside the
    lm_head module, which ZeRO-3 has partitioned. DeepSpeed gathers a parameter touched inside
    the engine's forward; the losses equal those of the plain loss over full logits."""
    short = [*RUN, "parallel=zero3", "model.vocab_multiple=65536", "trainer.max_steps=3", "trainer.warmup_steps=1", "trainer.export=false", "trainer.checkpoint_every_n_steps=100", "trainer.val_every_n_steps=100"]
    chunked, plain = tmp_path / "chunked", tmp_path / "plain"
    r = run_cli(short, chunked)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "chunked loss (1024 tokens)" in r.stdout and "vocab 65536 >= 65536" in r.stdout
    r = run_cli([*short, "trainer.loss_chunk_tokens=0"], plain)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "chunked loss" not in r.stdout
    assert len(logged(chunked, "loss")) == 3
    assert logged(chunked, "loss") == pytest.approx(logged(plain, "loss"), rel=1e-6)
    assert logged(chunked, "grad_norm") == pytest.approx(logged(plain, "grad_norm"), rel=1e-5)


def test_accumulated_micro_batches_give_the_gradient_of_every_other_strategy(tmp_path):
    """Lightning divides a micro batch's loss by the accumulation, and DeepSpeed's engine.backward
    divided it again: the gradients, the norm DeepSpeed reports and clips, were 1/accumulation of
    single's, so trainer.grad_clip acted at grad_clip x accumulation. The same 4 sequences a step:
    single accumulates 4 micro batches, zero2 2 on each of 2 ranks; both log the same grad_norm
    (zero2 logged half of it)."""
    args = [*MODEL, "experiment=smoke", "data.seq_len=32", "trainer.micro_batch_size=1", "trainer.global_batch_size=4", "trainer.max_steps=2", "trainer.warmup_steps=0", "trainer.log_every_n_steps=1", "trainer.val_batches=0", "trainer.progress_bar=false", "trainer.plot=false", "trainer.export=false"]
    norms = {}
    for name, strategy in (("single", []), ("zero2", ["parallel=zero2", *DEEPSPEED_ON_CPU])):
        r = run_cli([*args, *strategy], tmp_path / name)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        norms[name] = logged(tmp_path / name, "grad_norm")
    assert len(norms["zero2"]) == 2 and norms["zero2"] == pytest.approx(norms["single"], rel=1e-4), norms

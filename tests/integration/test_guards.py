"""Runtime guards on real CPU training: non-finite gradients named by layer, loss-scale collapse
explained (real fp16 autocast + GradScaler through the MixedPrecision plugin), grad-norm spikes."""

import json
import math

import pytest
import torch

from tests.conftest import compose, metrics_rows, run_cli
from tinytrain.errors import TrainingStopped

pytestmark = pytest.mark.slow
LAYER = "model.model.layers.1.mlp.down_proj.weight"
SMALL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128", "data.seq_len=32", "trainer.micro_batch_size=2", "trainer.warmup_steps=1", "trainer.progress_bar=false", "trainer.val_every_n_steps=1000", "trainer.checkpoint_every_n_steps=1000"]


def small_with(overrides) -> list[str]:
    """SMALL with `overrides` in place of its own values for the same keys."""
    given = {o.split("=")[0] for o in overrides}
    return [*(o for o in SMALL if o.split("=")[0] not in given), *overrides]


def train(overrides, run_dir, corrupt=None, steps=8, callbacks=(), fused_adamw=None):
    """Train in-process through tinytrain's own module, guards and Trainer; `corrupt(step, grad)`
    may rewrite the gradient of LAYER; `fused_adamw` overrides the plan's choice (a GPU's)."""
    from tinytrain.data.tokenizer import load_from_config
    from tinytrain.plan.planner import make_plan
    from tinytrain.train.fit import build_module
    from tinytrain.train.trainer import build_trainer, quiet_lightning

    cfg = compose(small_with([f"trainer.max_steps={steps}", *overrides]))
    tok = load_from_config(cfg.tokenizer)
    plan = make_plan(cfg, tok, run_dir)
    quiet_lightning()
    torch.manual_seed(0)
    module = build_module(cfg, plan, tok)
    if fused_adamw is not None:
        module.fused_adamw = fused_adamw
    if corrupt is not None:
        param = dict(module.named_parameters())[LAYER]
        param.register_hook(lambda g: corrupt(module.trainer.global_step, g))
    g = torch.Generator().manual_seed(0)
    micro = cfg.trainer.micro_batch_size
    rows = torch.randint(0, 4000, (steps * (cfg.trainer.global_batch_size or micro), cfg.data.seq_len + 1), generator=g)
    loader = torch.utils.data.DataLoader([{"input_ids": r[:-1], "labels": r[1:]} for r in rows], batch_size=micro)
    trainer = build_trainer(cfg, plan, run_dir, extra_callbacks=list(callbacks)).trainer
    trainer.fit(module, train_dataloaders=loader)
    return module, trainer


def test_vocab_mismatch_stops_before_the_first_step(tmp_path):
    r = run_cli(["model.vocab_size=4000", "trainer.progress_bar=false"], tmp_path / "run")
    assert r.returncode == 2
    assert "model.vocab_size=4000" in r.stderr and "len(tokenizer) is 4096" in r.stderr
    assert not (tmp_path / "run" / "metrics.csv").exists() and not (tmp_path / "run" / "checkpoints").exists()


def test_injected_nan_is_named_by_layer_and_stops_with_last_good_state(tmp_path):
    nan_at_step_3 = lambda step, grad: grad * float("nan") if step == 3 else grad  # noqa: E731
    with pytest.raises(TrainingStopped) as e:
        train(["guard.nonfinite=stop", "trainer.log_every_n_steps=3"], tmp_path, corrupt=nan_at_step_3)
    msg = str(e.value)
    assert f"step 4: first non-finite gradient (forward order) in {LAYER}" in msg, msg  # the 4th step, as progress lines count
    assert "guard.nonfinite=stop" in msg
    good = torch.load(tmp_path / "checkpoints" / "last_good.ckpt", weights_only=False)
    assert good["global_step"] == 3 and all(torch.isfinite(v).all() for v in good["state_dict"].values())
    # The stopping step has its row although it is off the logging interval (every 3 steps):
    # optimizer step 4 (logged as step 3, Lightning's numbering) with its loss and lr, and no
    # value of another step (Lightning keeps step 3's tokens_per_s).
    rows = metrics_rows(tmp_path)
    assert [r["step"] for r in rows] == ["2", "3"] and float(rows[1]["loss"]) > 0 and 0 < float(rows[1]["lr"]) != float(rows[0]["lr"])
    assert rows[0].get("tokens_per_s") and not rows[1].get("tokens_per_s"), rows
    assert rows[1]["grad_norm"] == "nan"  # this step's norm (on the logging interval it was the step before's)


def test_stop_under_fp16_leaves_an_overflow_to_the_loss_scaler(tmp_path, caplog):
    """guard.nonfinite=stop stopped a healthy fp16 run at the scaler's first overflow (a finite loss,
    the scaled gradients inf): the scaler skips that step and halves its scale."""
    inf_at_step_3 = lambda step, grad: grad * float("inf") if step == 3 else grad  # noqa: E731
    caplog.set_level("WARNING")
    train(["guard.nonfinite=stop", "precision=fp16"], tmp_path, corrupt=inf_at_step_3)
    assert "step 4: first non-finite gradient" in caplog.text and "the loss scale halves" in caplog.text


def test_skip_policy_skips_then_stops_after_too_many(tmp_path):
    always_nan = lambda step, grad: grad * float("nan") if step >= 2 else grad  # noqa: E731
    with pytest.raises(TrainingStopped) as e:
        train(["guard.max_consecutive_skips=2"], tmp_path, corrupt=always_nan)
    assert "3 consecutive non-finite steps" in str(e.value)
    good = torch.load(tmp_path / "checkpoints" / "last_good.ckpt", weights_only=False)
    assert all(torch.isfinite(v).all() for v in good["state_dict"].values())  # skipped steps changed nothing


def test_a_run_ending_on_weights_gone_non_finite_fails_and_exports_nothing(tmp_path):
    """lr=1e30: the first update makes the weights huge and every later step non-finite; with the
    default three skips allowed, a 4-step run ended with exit 0, validation nan and an exported model."""
    r = run_cli([*SMALL, "trainer.lr=1e30", "trainer.max_steps=4", "trainer.val_every_n_steps=2"], tmp_path / "run")
    assert r.returncode == 3, r.stderr[-2000:]
    assert "training ended at step 4 on weights whose validation loss is nan; steps 2-4 were skipped" in r.stderr, r.stderr[-2000:]
    assert "in or before the update of step 1" in r.stderr and "guard.nonfinite=stop" in r.stderr
    assert (tmp_path / "run" / "checkpoints" / "final.ckpt").exists() and not (tmp_path / "run" / "hf_export").exists()


def test_a_stopping_step_on_the_logging_interval_has_no_throughput_of_the_step_before(tmp_path):
    """The stopping step never finished: its row (written mid-step) had the last step's tokens_per_s."""
    nan_at_step_3 = lambda step, grad: grad * float("nan") if step == 3 else grad  # noqa: E731
    with pytest.raises(TrainingStopped):
        train(["guard.nonfinite=stop", "trainer.log_every_n_steps=1"], tmp_path, corrupt=nan_at_step_3)
    rows = metrics_rows(tmp_path)
    assert [r["step"] for r in rows] == ["0", "1", "2", "3"] and rows[2].get("tokens_per_s") and not rows[3].get("tokens_per_s"), rows


def test_fp16_loss_scale_collapse_is_explained(tmp_path):
    # Real fp16: an overflowing gradient in one layer makes GradScaler halve the scale every step.
    overflow = lambda step, grad: grad * float("inf") if step >= 1 else grad  # noqa: E731
    with pytest.raises(TrainingStopped) as e:
        train(["precision=fp16", "precision.loss_scale.initial_scale_power=12", "guard.loss_scale_halvings=4", "guard.max_consecutive_skips=100"], tmp_path, corrupt=overflow, steps=20)
    msg = str(e.value)
    assert "fp16 loss scale collapsed" in msg and "4 halvings in a row" in msg
    step = int(msg.split("collapsed at step ")[1].split(":")[0])
    last = metrics_rows(tmp_path)[-1]  # the stopping step's row, with the scale that stopped it
    assert last["step"] == str(step - 1) and float(last["loss_scale"]) == float(msg.split(" -> ")[1].split(" ")[0])
    assert "gradient overflow first seen in" in msg and "layers.1.mlp.down_proj" in msg
    assert "model.untrained_tokens=mean" in msg and "bf16" in msg


def test_a_fused_adamw_under_fp16_clips_and_logs_the_unscaled_gradients(tmp_path):
    """The plan picks torch's fused AdamW on every CUDA GPU, fp16 (a V100) included. Its step unscales
    the gradients itself, so Lightning leaves them scaled for the clipping, the guard and the logged
    grad_norm: 65536 times the norm, every step clipped to 1/65536 of the update. It must train as
    the plain AdamW does."""
    fp16 = ["precision=fp16", "trainer.log_every_n_steps=1", "trainer.grad_clip=1.0"]
    plain, _ = train(fp16, tmp_path / "plain", steps=3, fused_adamw=False)
    fused, _ = train(fp16, tmp_path / "fused", steps=3, fused_adamw=True)
    norms = {name: [float(r["grad_norm"]) for r in metrics_rows(tmp_path / name)] for name in ("plain", "fused")}
    assert len(norms["plain"]) == 3 and norms["fused"] == pytest.approx(norms["plain"], rel=1e-4), norms
    for (name, a), b in zip(plain.named_parameters(), fused.parameters()):
        torch.testing.assert_close(b, a, rtol=0, atol=1e-4, msg=name)  # the bug: ~1/65536 of a 3e-3 step


def test_the_schedule_waits_on_the_steps_fp16_skips(tmp_path):
    """GradScaler skips a step whose fp16 gradients overflowed; the schedule waits with it (as it does
    under DeepSpeed), so skips at the start do not use up the warm-up."""
    module, trainer = train(["precision=fp16", "precision.loss_scale.initial_scale_power=24", "trainer.warmup_steps=4", "trainer.log_every_n_steps=1"], tmp_path, steps=8)
    rows = metrics_rows(tmp_path)
    applied = [math.isfinite(float(r["grad_norm"])) for r in rows]
    skipped = round(math.log2(2.0**24 / trainer.precision_plugin.scaler.get_scale()))  # halved once per skip
    assert 0 < skipped < 8 and applied.count(False) == skipped, rows
    assert module.lr_schedulers().last_epoch == 8 - skipped
    # Each row's lr is the rate its step ran at: it moves on after an applied step only.
    lrs = [float(r["lr"]) for r in rows]
    assert [b != a for a, b in zip(lrs, lrs[1:])] == applied[:-1], rows


def test_grad_norm_spike_is_logged_as_an_event(tmp_path):
    spike = lambda step, grad: grad * 1e4 if step == 12 else grad  # noqa: E731
    train(["guard.grad_spike_warmup=3"], tmp_path, corrupt=spike, steps=16)
    events = [json.loads(line) for line in (tmp_path / "grad_spikes.jsonl").read_text().splitlines()]
    assert [e["step"] for e in events] == [13] and events[0]["ratio"] > 5  # logged after optimizer step 12


def test_steps_off_the_logging_interval_log_nothing_yet_rows_and_the_spike_monitor_see_every_value(tmp_path, monkeypatch):
    """Each Lightning `log` deep-copies its metadata (0.3-1 ms, a small model's fixed per-step cost):
    off the interval the step's loss and grad_norm are kept on the module, not logged; the rows
    (steps 3 and 7 at every 4) and the last step's progress line still get them."""
    from lightning.pytorch.trainer.connectors.logger_connector.result import _ResultCollection

    logged_at: dict[int, list[str]] = {}
    original = _ResultCollection.log

    trainers = []  # the run's Trainer, for the step each `log` belongs to
    from tinytrain.train import trainer as trainer_module

    build = trainer_module.build_trainer

    def keeping_the_trainer(*args, **kwargs):
        built = build(*args, **kwargs)
        trainers.append(built.trainer)
        return built

    def counting(self, fx, name, *args, **kwargs):
        logged_at.setdefault(trainers[0].global_step, []).append(name)
        return original(self, fx, name, *args, **kwargs)

    monkeypatch.setattr(trainer_module, "build_trainer", keeping_the_trainer)
    monkeypatch.setattr(_ResultCollection, "log", counting)
    module, _ = train(["trainer.log_every_n_steps=4"], tmp_path, steps=10)
    assert {step: sorted(names) for step, names in logged_at.items()} == {
        **{row: ["grad_norm", "loss", "lr"] for row in (3, 7)},
        **{row + 1: ["tokens_per_s"] for row in (3, 7, 9)},  # the throughput callback's, after the step
        9: ["grad_norm", "loss", "lr"],  # the last step's: its row (final validation) and progress line read them
    }
    rows = metrics_rows(tmp_path)
    assert [r["step"] for r in rows] == ["3", "7"] and all(float(r["loss"]) > 0 and float(r["grad_norm"]) > 0 for r in rows)
    assert set(module.step_values) == {"loss", "grad_norm"}

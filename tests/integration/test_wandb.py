"""logger=[wandb,tensorboard]: wandb in offline mode (no key, no network), whose run file holds the
config, the plan and the metrics, and TensorBoard event files beside it, read back with
TensorBoard's own reader."""

import json
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.integration.wandb_records import read_run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("loggers") / "run"
    env = {"WANDB_MODE": "offline", "WANDB_API_KEY": "", "WANDB_SILENT": "true"}
    r = run_cli(["experiment=smoke", "logger=[wandb,tensorboard]", "logger.wandb_group=ci", "logger.wandb_tags=[smoke]", "trainer.progress_bar=false"], run_dir, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return run_dir


def test_tensorboard_events_hold_loss_and_lr(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (run_dir / "tensorboard").glob("events.out.tfevents.*")
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    assert {"loss", "lr", "grad_norm", "val_loss"} <= set(scalars), scalars
    losses = [e.value for e in acc.Scalars("loss")]
    assert [e.step for e in acc.Scalars("loss")] == [1, 3, 5, 7] and losses[-1] < losses[0]  # smoke: logged every 2 of 8 steps
    assert all(0 < e.value <= 3e-3 * (1 + 1e-6) for e in acc.Scalars("lr"))


def test_offline_wandb_run_holds_config_plan_and_metrics(run_dir):
    runs = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    config, history = read_run(Path(runs[0]))
    assert config["model"]["name"] == "tiny" and config["logger"]["wandb_group"] == "ci"
    assert config["plan"]["vocab"]["padded"] == 4096 and config["plan"]["precision"]["value"] == "32-true"
    losses = [row["loss"] for row in history if "loss" in row]
    assert len(losses) >= 3 and losses[-1] < losses[0]
    assert any("val_loss" in row for row in history) and any("tokens_per_s" in row for row in history)
    assert (run_dir / "metrics.csv").exists()  # the CSV metrics are kept next to wandb
    # Sample generations at each validation step: one wandb table beside samples.jsonl, logged
    # incrementally (each validation sends its own rows, not every earlier one again).
    tables = [row["samples/_type"] for row in history if "samples/_type" in row]
    assert tables == ["incremental-table-file", "incremental-table-file"], tables
    # Each table sits at its validation's step, as Lightning counts it for val_loss (one less than samples.jsonl's).
    table_steps = [row["trainer/global_step"] for row in history if "samples/_type" in row]
    val_steps = [row["trainer/global_step"] for row in history if "val_loss" in row]
    assert table_steps == val_steps, (table_steps, val_steps)
    increments = [json.loads(p.read_text()) for p in runs[0].parent.glob("files/media/table/samples_*.table.json")]
    assert len(increments) == 2 and all(t["columns"] == ["step", "prompt", "completion"] and len(t["data"]) == 2 for t in increments), increments  # 2 prompts a validation
    assert sorted(row[0] for t in increments for row in t["data"]) == [4, 4, 8, 8]
    assert len((run_dir / "samples.jsonl").read_text().splitlines()) == 4

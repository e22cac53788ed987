"""The checkpoint line of the plan: size on disk per strategy and precision, host memory at save,
keep_last and the disk they need, free space at run.root, save time; preflight's refusal of a run
root too small for keep_last + 1 checkpoints. (The size estimate is checked against real
checkpoints of every strategy in tests/integration: test_train_cpu.py, test_deepspeed.py,
test_sharded_checkpoints.py.)"""

import os

import pytest

from tests.conftest import compose, mounted_tmpfs
from tinytrain.cli import run_stages
from tinytrain.errors import ConfigError

# Not every strategy fits a 7B model on these GPUs (ddp holds it whole): the sizes are the point.
A800_7B = ["mode=plan", "model=llama2_7b", "hardware.gpu=A800", "cluster.devices=8", "preflight.memory=warn"]


def checkpoint(tmp_path, *overrides):
    plan = run_stages(compose([*A800_7B, *overrides]), tmp_path)
    return plan.checkpoint, plan


def test_sizes_per_strategy_and_precision(tmp_path):
    sharded, plan = checkpoint(tmp_path, "parallel=fsdp_tp", "parallel.tp=2")
    p = plan.params
    assert sharded.format == "sharded" and sharded.step_bytes == pytest.approx(12 * p, rel=1e-3)  # fp32 weights + Adam moments
    assert sharded.largest_rank_bytes == pytest.approx(12 * p / 8, rel=1e-3)  # each of 8 ranks writes its eighth
    assert sharded.save_host_bytes < sharded.largest_rank_bytes / 10  # streamed tensor by tensor, never gathered
    assert sharded.gathered_host_bytes == pytest.approx(8 * sharded.largest_rank_bytes, rel=1e-3)  # what rank 0 held before
    # keep_last 3 + the one being written + the end of the run's export (bf16 weights)
    assert sharded.end_bytes == pytest.approx(2 * p, rel=1e-3) and sharded.disk_needed_bytes == pytest.approx(4 * sharded.step_bytes + 2 * p, rel=1e-3)
    staged, _ = checkpoint(tmp_path, "parallel=fsdp_tp", "parallel.tp=2", "checkpoint.async_save=true")
    assert staged.save_host_bytes == staged.largest_rank_bytes  # async: the rank's shard staged in host memory
    zero2_bf16, _ = checkpoint(tmp_path, "parallel=zero2")
    zero2_fp32, _ = checkpoint(tmp_path, "parallel=zero2", "precision=fp32")
    zero3, _ = checkpoint(tmp_path, "parallel=zero3")
    assert zero2_bf16.step_bytes == pytest.approx(14 * p, rel=1e-3) and zero2_fp32.step_bytes == pytest.approx(16 * p, rel=1e-3)
    assert zero3.step_bytes == pytest.approx(12 * p, rel=1e-3) and zero3.format == "deepspeed"
    ddp, _ = checkpoint(tmp_path, "parallel=ddp", "checkpoint.keep_last=5")
    assert ddp.format == "file" and ddp.largest_rank_bytes == ddp.step_bytes and ddp.disk_needed_bytes == pytest.approx(6 * ddp.step_bytes + 2 * p, rel=1e-3)
    assert zero2_bf16.end_bytes == pytest.approx((2 + 4) * p, rel=1e-3)  # the export and DeepSpeed's consolidated fp32 weights
    unexported, _ = checkpoint(tmp_path, "parallel=zero2", "trainer.export=false")
    assert unexported.end_bytes == 0 and unexported.disk_needed_bytes == pytest.approx(4 * unexported.step_bytes, rel=1e-3)



def test_plan_prints_the_checkpoint_line_and_plan_json_carries_it(tmp_path, capsys):
    _, plan = checkpoint(tmp_path, "parallel=fsdp_tp", "parallel.tp=2")
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("checkpoint "))
    assert "sharded folder, every rank its own file: 78.1 GB per step checkpoint" in line and "keep_last 3 + 1 being written + export 13.0 GB = 325.5 GB" in line
    assert "free at run.root" in line and "(gathered on rank 0: 78.1 GB)" in line
    import json

    written = json.loads((tmp_path / "plan.json").read_text())["checkpoint"]
    assert written["step_bytes"] == plan.checkpoint.step_bytes and written["free_bytes"] > 0 and written["keep_last"] == 3


def test_a_save_slower_than_its_share_of_the_time_between_saves_warns(tmp_path):
    slow, _ = checkpoint(tmp_path, "parallel=zero3", "checkpoint.write_gbps=0.5", "trainer.checkpoint_every_n_steps=100")
    assert any("checkpoint.write_gbps=0.5" in w and "checkpoint.max_save_share=0.1" in w for w in slow.warnings), slow.warnings
    fast, _ = checkpoint(tmp_path, "parallel=zero3", "checkpoint.write_gbps=50", "trainer.checkpoint_every_n_steps=100")
    assert not [w for w in fast.warnings if "write_gbps" in w]


@pytest.fixture
def tiny_disk(tmp_path):
    mount_point = tmp_path / "tiny_disk"
    mount_point.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    with mounted_tmpfs(mount_point, "size=20m"):
        yield mount_point


def test_a_run_root_without_room_for_keep_last_plus_one_is_refused_before_training(tiny_disk):
    # A 7.2 MB checkpoint: keep_last 3 + 1 and the fp32 export (2.4 MB) need 31.3 MB of the 20 MB disk.
    model = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
    cfg = compose(["experiment=smoke", *model, "data.seq_len=32", f"run.root={tiny_disk}"])
    with pytest.raises(ConfigError) as e:
        run_stages(cfg, tiny_disk / "run")
    message = str(e.value)
    assert f"run.root='{tiny_disk}'" in message and "3 kept checkpoints + the one being written + the export at the end (2.4 MB) need 31.3 MB" in message
    assert "checkpoint.keep_last=1 fits" in message
    assert not (tiny_disk / "run" / "checkpoints").exists()
    # mode=plan (planning for a cluster from elsewhere) says it instead of stopping.
    plan = run_stages(compose(["mode=plan", "experiment=smoke", *model, "data.seq_len=32"]), tiny_disk / "plan")
    assert any(w.startswith("run.root='runs': has ") and "need 31.3 MB" in w for w in plan.checkpoint.warnings), plan.checkpoint.warnings


def test_an_export_dir_on_another_filesystem_is_not_counted_at_run_root(tiny_disk, tmp_path):
    """export.dir on another disk is the remedy the export's disk-full message names: run.root need
    not hold the export then; DeepSpeed's consolidated weights stay in checkpoints/ and count."""
    here, plan = checkpoint(tmp_path / "run", "parallel=zero2", f"export.dir={tmp_path / 'model'}")
    elsewhere, _ = checkpoint(tmp_path / "run", "parallel=zero2", f"export.dir={tiny_disk / 'model'}")
    assert here.end_bytes == pytest.approx(6 * plan.params, rel=1e-3) and elsewhere.end_bytes == pytest.approx(4 * plan.params, rel=1e-3)


def test_a_run_short_of_both_disk_and_host_memory_is_told_both_at_once(tiny_disk, monkeypatch):
    # The disk check comes first in the plan; it must not hide the node's memory (a job that
    # cannot hold the model at all), nor the other way round.
    monkeypatch.setenv("SLURM_MEM_PER_NODE", "1024")
    cfg = compose(["experiment=smoke", "model=tinyllama_1b", "data.seq_len=32", f"run.root={tiny_disk}"])
    with pytest.raises(ConfigError) as e:
        run_stages(cfg, tiny_disk / "run")
    assert [p.key for p in e.value.problems] == ["model", "run.root"], e.value.problems
    message = str(e.value)
    assert "2 configuration errors" in message and "kept checkpoints + the one being written + the export at the end" in message and "the Slurm job's --mem" in message, message


@pytest.mark.parametrize("parallel", ["zero2", "zero3"])
def test_deepspeed_partitions_over_every_rank_of_a_context_parallel_group(tmp_path, parallel):
    # Ulysses' ranks are DeepSpeed's data-parallel ranks: each holds 1/world of the optimizer
    # state whatever the cp, so what a rank writes and copies to the host at a save does not grow
    # with it (it grew x cp when divided by dp = world / cp).
    long = [f"parallel={parallel}", "model=llama3_1_8b", "hardware.gpu=H100", "trainer.micro_batch_size=1", "trainer.global_batch_size=8", "data.seq_len=32768", "trainer.activation_checkpointing=full"]
    figures = {}
    for cp in (1, 2, 8):
        saved, plan = checkpoint(tmp_path, *long, f"parallel.cp={cp}")
        figures[cp] = (saved.step_bytes, saved.largest_rank_bytes, saved.save_host_bytes, plan.host.training_bytes, plan.host.peak_bytes)
    assert figures[2] == figures[1] and figures[8] == figures[1], figures
    assert figures[1][1] < figures[1][0] / 2  # rank 0 writes an eighth of the optimizer state (and ZeRO-2 the weights)


def test_a_slurm_requeue_save_longer_than_the_signal_delay_warns(tmp_path):
    # zero3 7B: ~84 GB a checkpoint; at 0.2 GB/s a save takes ~420 s, past the default 300 s warning.
    slurm = ["cluster=slurm", "cluster.nodes=1", "parallel=zero3"]
    late, _ = checkpoint(tmp_path, *slurm, "checkpoint.write_gbps=0.2")
    (warning,) = [w for w in late.warnings if "cluster.signal_delay_s" in w]
    assert "cluster.signal_delay_s=300" in warning and "raise cluster.signal_delay_s to" in warning, warning
    raised = int(warning.split("raise cluster.signal_delay_s to ")[1].split()[0])
    ok, _ = checkpoint(tmp_path, *slurm, "checkpoint.write_gbps=0.2", f"cluster.signal_delay_s={raised}")
    assert not [w for w in ok.warnings if "cluster.signal_delay_s" in w]
    short, _ = checkpoint(tmp_path, *slurm, "checkpoint.write_gbps=0.2", "cluster.time=00:10:00")  # 782 would not fit in 600 s
    (warning,) = [w for w in short.warnings if "cluster.signal_delay_s" in w]
    assert "raise cluster.signal_delay_s to 599 (the most below cluster.time=00:10:00)" in warning, warning
    tight, _ = checkpoint(tmp_path, *slurm, "checkpoint.write_gbps=0.2", "cluster.time=00:05:00")
    assert "a longer cluster.time (no delay below 00:05:00 leaves room for it)" in next(w for w in tight.warnings if "cluster.signal_delay_s" in w)
    local, _ = checkpoint(tmp_path, "parallel=zero3", "checkpoint.write_gbps=0.2")  # no Slurm signal to wait for
    assert not [w for w in local.warnings if "cluster.signal_delay_s" in w]

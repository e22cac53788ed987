"""trainer.micro_batch_size=auto (plan/micro_batch.py): the largest micro batch that fits the GPU
with the safety margin, under the cheapest checkpointing mode that lets one fit, the global batch
kept by the accumulation, and the table it chose from in the plan."""

import pytest
from omegaconf import OmegaConf

from tests.conftest import plan
from tinytrain.plan.checkpointing import ModeCost
from tinytrain.plan.micro_batch import SAFETY_MARGIN, candidates, choose

BIG = ["model=llama3_1_8b", "hardware.gpu=H100", "parallel=zero3", "cluster.devices=8", "trainer.global_batch_size=64", "trainer.micro_batch_size=auto"]


def test_candidates_keep_the_global_batch():
    assert candidates(64, 8) == [1, 2, 4, 8]
    assert candidates(48, 4) == [1, 2, 3, 4, 6, 12]


def row(micro, mode, total):
    return ModeCost(micro, mode, 0.0, total, None, None)


def test_the_cheapest_mode_that_fits_then_the_largest_micro_batch():
    table = [row(1, "none", 70), row(2, "none", 90), row(1, "full", 20), row(2, "full", 40), row(4, "full", 80)]
    limit = (1 - SAFETY_MARGIN) * 80
    assert choose(table, ["none", "full"], 80)[:2] == (1, "none")  # 70 <= 72
    assert choose(table, ["full"], 80)[:2] == (2, "full")  # 80 > 72: the margin leaves micro batch 4 out
    micro, mode, why = choose([row(1, "none", 79)], ["none"], 80)
    assert (micro, mode) == (1, "none") and f"under {limit:.1f} GiB" in why and "no micro batch fits" in why


@pytest.mark.parametrize(("extra", "micro", "mode"), [(["data.seq_len=4096"], 2, "none"), (["data.seq_len=8192", "trainer.activation_checkpointing=auto"], 1, "none"), (["data.seq_len=8192", "trainer.activation_checkpointing=full"], 8, "full")])
def test_the_plan_picks_and_prints_the_table(extra, micro, mode, tmp_path, capsys):
    p = plan([*BIG, *extra], tmp_path)
    b = p["batch"]
    assert (b["micro_batch_size"], b["accumulate_grad_batches"], b["global_batch_size"]) == (micro, 8 // micro, 64)
    assert p["deepspeed"]["train_micro_batch_size_per_gpu"] == micro and p["deepspeed"]["gradient_accumulation_steps"] == 8 // micro
    c = p["activation_checkpointing"]
    assert c["mode"] == mode and c["reason"].startswith("auto: the largest micro batch")
    # Under checkpointing=auto the reason says why a larger micro batch of a costlier mode was not taken.
    assert c["reason"].endswith(f", under {mode}: the cheapest checkpointing mode in which one does") == ("trainer.activation_checkpointing=auto" in extra), c["reason"]
    assert sorted({r["micro_batch"] for r in c["table"]}) == [1, 2, 4, 8]
    # The record holds what auto decided (it kept `auto` and a null accumulation).
    resolved = OmegaConf.load(tmp_path / "config_resolved.yaml")
    assert (resolved.trainer.micro_batch_size, resolved.trainer.accumulate_grad_batches, resolved.trainer.activation_checkpointing) == (micro, 8 // micro, mode)
    assert resolved.precision.fp8 is False
    chosen = next(r for r in c["table"] if (r["micro_batch"], r["mode"]) == (micro, mode))
    assert chosen["total_gib"] == p["memory_per_gpu"]["total_gib"] <= (1 - SAFETY_MARGIN) * p["memory_per_gpu"]["gpu_memory_gib"]
    assert f"micro batch {micro:>3} {mode:<9}" in capsys.readouterr().out


def test_kto_under_auto_chooses_two_examples_or_more(tmp_path, capsys):
    """KTO pairs each example with another one of its micro batch (its KL row): auto chose from 1
    up (the check for 2 compared the string "auto" with 2 and died with a TypeError)."""
    kto = ["experiment=dpo_smoke", "finetune.objective=kto", "data.path=${tt.asset:examples/kto_tiny.jsonl}", "hardware.gpu=A100", "trainer.micro_batch_size=auto", "trainer.global_batch_size=8", "trainer.activation_checkpointing=full"]
    p = plan(kto, tmp_path)
    assert sorted({r["micro_batch"] for r in p["activation_checkpointing"]["table"]}) == [2, 4, 8]
    assert "= 8 examples (each a completion and a KL row: its prompt with another example's completion) of up to" in capsys.readouterr().out
    assert candidates(8, 4, smallest=2) == [2] and candidates(4, 4, smallest=2) == []


def test_a_batch_warm_up_is_laid_out_at_the_micro_batch_auto_chooses(tmp_path):
    """The ramp was checked at auto's placeholder micro batch 1 (unit dp x accumulation = the whole
    global batch): every start was refused, and the fix it named was refused in turn."""
    from tinytrain.errors import ConfigError

    ramp = ["model=tinyllama_1b", "hardware.gpu=H100", "trainer.micro_batch_size=auto", "trainer.global_batch_size=64", "data.seq_len=2048", "trainer.batch_size_warmup.tokens=1000000"]
    p = plan([*ramp, "trainer.batch_size_warmup.start=32"], tmp_path / "ramp")
    b = p["batch"]
    assert (b["micro_batch_size"], b["accumulate_grad_batches"]) == (8, 8) and p["batch_size_warmup"]["start"] == 32
    with pytest.raises(ConfigError) as e:  # at micro batch 8 a step is 8 micro batches
        plan([*ramp, "trainer.batch_size_warmup.start=5"], tmp_path / "odd")
    message = str(e.value)
    assert "batch_size_warmup.start=5: not a multiple of data_parallel(1) x accumulate_grad_batches(8) = 8" in message
    assert "(at micro batch 8, which trainer.micro_batch_size=auto chose: the largest micro batch whose" in message and "or set trainer.micro_batch_size to a number" in message


def test_auto_checkpointing_keeps_the_margin_auto_micro_batches_keep(tmp_path):
    """activation_checkpointing=auto chose selective at 69.0 of the A800's 74.5 GiB, 93%: a row
    micro_batch_size=auto refuses for the 10% its estimate leaves out (CUDA context, NCCL's
    buffers, fragmentation). The table's `fits` stays the memory check's, the whole GPU."""
    p = plan(["model=llama3_8b", "hardware.gpu=A800", "parallel=zero3", "cluster.devices=8", "trainer.micro_batch_size=2", "trainer.global_batch_size=64", "data.seq_len=8192", "trainer.activation_checkpointing=auto"], tmp_path)
    c = p["activation_checkpointing"]
    selective = next(r for r in c["table"] if r["mode"] == "selective")
    assert selective["fits"] and selective["total_gib"] > (1 - SAFETY_MARGIN) * 74.5
    assert c["mode"] == "full" and "with auto's 10% margin" in c["reason"]

"""benchmarks/gpu_check.sh part by part on a CPU (--dry-run): parts b (DeepSpeed zero2 in fp16 with
the loss scale policy on its CPU accelerator) and headline (mfu.py on packed documents, plain and
with selective checkpointing, and packed isolation on the varlen kernel's CPU reference) append to
one results file, each part's rows beside the other's; an unknown part and a wheel folder missing a package stop with the fix
before anything runs. Part a (packed isolation on the CPU references of the kernels, a tiny fp32 run
with export) runs in tests/integration/test_gpu_wheels.py, from the wheel folder in a bare venv as on
the GPU image. On a GPU machine the same parts run the real checks (benchmarks/README.md)."""

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def gpu_check(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    # WHEELS: no wheel folder here, the venv has every package already (a path of this test's own:
    # a /nonexistent that some other program made was read as an empty wheel folder).
    env = {**os.environ, "PYTHON": sys.executable, "WHEELS": str(REPO / "benchmarks" / ".no-wheels-in-tests"), **(env or {})}
    return subprocess.run(["bash", "benchmarks/gpu_check.sh", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


def test_parts_append_to_one_results_table(tmp_path):
    for part in ("b", "headline"):
        result = gpu_check("--part", part, "--out", str(tmp_path), "--dry-run")
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((tmp_path / "gpu_check.json").read_text())
    assert sorted(results["parts"]) == ["b", "headline"] and all(h["device"] == "CPU (dry run)" and "torch " in h["versions"] for h in results["parts"].values())
    rows = {r["check"]: r for r in results["rows"]}
    for check in ("train zero2_fp16", "mfu.py packed", "mfu.py packed + selective", "packed isolation varlen"):
        assert rows[check]["status"] == "ok", rows[check]
    assert "loss scale 4096" in rows["train zero2_fp16"]["note"]
    assert "host " in rows["train zero2_fp16"]["note"] and "GiB (plan " in rows["train zero2_fp16"]["note"]  # peak host memory beside the host line
    assert rows["train zero2_bf16 / zero3_bf16"]["status"].startswith("skipped (dry run")
    assert "batch 2x128 packed" in rows["mfu.py packed"]["note"] and float(rows["mfu.py packed + selective"]["plan GiB"]) > 0
    assert "aten::mm " in rows["mfu.py packed"]["note"].split("; top: ")[1]  # the plain run is profiled: where the time goes
    assert "aten::mm" in (tmp_path / "part_headline" / "mfu_packed.ops.txt").read_text()
    assert "torch_varlen_reference (cpu reference): max |packed - alone|" in rows["packed isolation varlen"]["note"]
    table = (tmp_path / "gpu_check.md").read_text()
    assert table.count("\n| b | ") == 2 and table.count("\n| headline | ") == 4 and "- part headline: " in table


def test_the_mfu_part_runs_accumulated_micro_batches_on_both_sides(tmp_path):
    """Part c on a CPU: mfu.py plain, and packed rows with several micro batches per optimizer step
    on both sides (8 on a GPU, 2 here), timed per step."""
    result = gpu_check("--part", "c", "--out", str(tmp_path), "--dry-run")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {r["check"]: r for r in json.loads((tmp_path / "gpu_check.json").read_text())["rows"]}
    assert rows["mfu.py plain"]["status"] == rows["mfu.py packed micro 1 x 8"]["status"] == "ok", rows
    assert "batch 2x128 x 2 packed" in rows["mfu.py packed micro 1 x 8"]["note"]
    log = (tmp_path / "part_c" / "mfu_packed_micro_1_x_8.log").read_text()
    assert "x 2 micro batches per step (plan)" in log and "`max_steps=5` reached" in log  # 5 steps of 2 micro batches
    refused = subprocess.run([sys.executable, "benchmarks/mfu.py", "--tiny", "--accumulation", "0"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2 and "--accumulation 0: a step needs at least one micro batch (use --accumulation 1" in refused.stderr


def test_the_long_context_part_holds_a_layer_to_the_plan_s_count(tmp_path):
    """Part f on a CPU: a small Llama layer at 0.5k-2k tokens, each kernel's row with what the layer
    kept against plan/activations.py's count, and its peak in backward against the plan's count of a
    checkpointed layer's recompute. SDPA's CPU flash kernel keeps what a GPU's does (the varlen
    stand-in is pure torch and keeps its scores: only its rows' presence is checked here; it is
    quadratic, so 4k tokens took most of the part's 50 s)."""
    result = gpu_check("--part", "f", "--out", str(tmp_path), "--dry-run", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    rows = {r["check"]: r for r in json.loads((tmp_path / "gpu_check.json").read_text())["rows"]}
    assert sorted(rows) == sorted(f"layer {k} {n}k" for k in ("varlen", "sdpa") for n in ("0.5", "1", "2"))
    assert all(r["status"] == "ok" and "x the plan's count" in r["note"] for r in rows.values())
    figures = json.loads((tmp_path / "part_f" / "long_context_layer.json").read_text())["rows"]
    sdpa_2k = next(r for r in figures if r["kernel"] == "sdpa" and r["seq"] == 2048)
    assert 0.95 < sdpa_2k["kept_over_plan"] < 1.05, sdpa_2k
    assert 0.5 < sdpa_2k["peak_over_plan"] <= 1.0, sdpa_2k  # the layer's backward within the recompute the plan counts


def test_the_ring_part_compares_two_ranks_with_whole_sequences(tmp_path):
    """Part e on a CPU: the ring worker on two gloo ranks (SDPA over the block mask), its loss,
    logits and worst gradient read back into the row, as a 2-GPU lease would read the flex kernel's."""
    result = gpu_check("--part", "e", "--out", str(tmp_path), "--dry-run", timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (row,) = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    assert row["check"] == "ring cp 2 (2 CPU ranks, gloo)" and row["status"] == "ok", row
    assert "vs whole sequences: loss " in row["note"] and "worst gradient " in row["note"], row
    assert float(row["note"].split("worst gradient ")[1].split()[0]) < 1e-5


def test_an_unknown_part_names_the_parts(tmp_path):
    result = gpu_check("--part", "g", "--out", str(tmp_path), timeout=30)
    assert result.returncode == 2 and "--part 'g' is not a part: use headline (the MFU table, first), a (isolation + bf16 run), b (DeepSpeed), c (mfu.py), d (memory), e (ring) or f (long-context layer)" in result.stderr
    assert not any(tmp_path.iterdir())


def test_an_out_that_is_a_file_is_named_with_the_fix(tmp_path):
    (tmp_path / "results.txt").write_text("an earlier note\n")
    result = gpu_check("--part", "a", "--out", str(tmp_path / "results.txt"), "--dry-run", timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"--out {tmp_path / 'results.txt'} is a file" in result.stderr and "Fix: give a folder path" in result.stderr
    assert (tmp_path / "results.txt").read_text() == "an earlier note\n"


def test_a_wheel_folder_missing_a_package_names_it_and_the_fix(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    pins = [line for line in (REPO / "benchmarks" / "gpu_wheels.txt").read_text().splitlines() if line and not line.startswith("#")]
    for pin in pins:  # the names gpu_wheels.sh gives them; empty files are enough to stop before the install
        if not pin.startswith(("omegaconf", "deepspeed")):
            name, version = pin.split("==")
            (folder / f"{name.replace('-', '_').lower()}-{version}-py3-none-any.whl").touch()
    result = gpu_check("--part", "a", "--out", str(tmp_path / "out"), env={"WHEELS": str(folder)}, timeout=30)
    assert result.returncode == 2, result.stderr
    assert "lacks omegaconf==2.3.1 deepspeed==0.19.8: fill it on a machine with PyPI with: bash benchmarks/gpu_wheels.sh" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "out").exists()


def load_gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "benchmarks" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_parts_read_a_carried_corpus_or_stop_with_the_fix(tmp_path, monkeypatch, capsys):
    """A GPU machine gets the checkout alone, not ../shared beside it: the training parts (a, b, d)
    read the copy in benchmarks/.data, and with neither stop before any work, naming the fix."""
    gpu_check_module = load_gpu_check()
    monkeypatch.setattr(gpu_check_module, "SHARED_TEXT", tmp_path / "shared" / "tinyshakespeare.txt")
    monkeypatch.setattr(gpu_check_module, "CARRIED_TEXT", tmp_path / "carried" / "tinyshakespeare.txt")
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--part", "b", "--out", str(tmp_path / "out"), "--dry-run"])
    with pytest.raises(SystemExit) as stop:
        gpu_check_module.main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and not (tmp_path / "out").exists()
    assert "part b trains on tinyshakespeare, and neither ../shared/data" in err and "cp ../shared/data/tinyshakespeare.txt benchmarks/.data/`, and carry benchmarks/.data" in err
    carried = tmp_path / "carried" / "tinyshakespeare.txt"
    carried.parent.mkdir()
    carried.write_text("To be, or not to be.\n")
    assert gpu_check_module.corpus() == [f"data.path={carried}"]
    assert f"data.path={carried}" in gpu_check_module.common(False, 4, 2)


def test_the_headline_s_loss_covers_the_rows_the_plan_counts():
    """mfu.py's TinyLlama trains on its own tokenizer (Llama-2's 32,000 pieces) where one is at hand
    (here ../shared/data): its loss covers every row of the head, as the plan counts them. The H100
    run of 2026-11-27 passed model.vocab_size=32000 over the bundled tokenizer, whose loss covered 4,096
    (tinytrain/plan/memory_margin.py)."""
    code = ("import sys; sys.path.insert(0, 'benchmarks'); from mfu import tinyllama_vocab; from _common import setup; "
            "overrides, note = tinyllama_vocab(); print(note); plan = setup(['model=tinyllama_1b', *overrides, 'mode=plan'])[2]; print('vocab', plan.vocab.true, plan.vocab.padded)")
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "the Llama-2 tokenizer (../shared/data/llama2-tokenizer/tokenizer.model)" in result.stdout and "vocab 32000 32000" in result.stdout, result.stdout

"""parallel.cp for real: DeepSpeed's Ulysses attention under Lightning's DeepSpeedStrategy (zero2,
zero3) and ModelParallelStrategy (fsdp_tp, tp 1) on two CPU ranks over gloo, and torch's ring under
fsdp_tp (dp 1 x cp 2 x tp 1 on two ranks, dp 1 x cp 2 x tp 2 on four), equals one rank holding whole
sequences, for the same batches and weights.

The windows are packed pretraining documents (position ids restart per document), so equality with
cp=1, whose SDPA masks documents apart, is also the proof that documents stay isolated after
Ulysses gathers the sequence. Losses and gradient norms are compared at every step and the weights
after the run, which only agree when every gradient did; then a cp=2 run resumes on one rank (cp=1)
and continues as the uninterrupted cp=1 run does.
"""

import re

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import logged, run_cli, run_ranks

pytestmark = pytest.mark.slow

MODEL = ["model.num_layers=2", "model.hidden_size=64", "model.num_heads=4", "model.num_kv_heads=2", "model.intermediate_size=128"]
RUN = [
    "experiment=smoke",
    *MODEL,
    "data.seq_len=32",
    "trainer.max_steps=4",
    "trainer.log_every_n_steps=1",
    "trainer.progress_bar=false",
    "trainer.plot=false",
    "trainer.checkpoint_every_n_steps=2",
    "export.dtype=fp32",
    "parallel.deepspeed_on_cpu=true",
]
RTOL = 1e-5
# DeepSpeed's Ulysses exchange in compiled blocks: before DeepSpeed 0.19.7 the compiled layers got
# no gradient for q, k and v (plan/context.py refuses the pair there).
COMPILED = ["trainer.compile=blocks", "trainer.compile_backend=aot_eager"]
SFT = ["data=alpaca", "data.seq_len=128", "data.group_by_length=false"]
RING_SEQ = ["data.seq_len=256"]
SFT_RING = [*SFT, *RING_SEQ, "data.pad_to_multiple_of=256"]
# Ring's kernel on a CPU attends each rank's half of the queries (SDPA over the block mask), so its
# sums round differently from the whole sequence's: the gradients agree to ~3e-7
# (test_ring_attention.py), the losses to ~1e-7, and AdamW's first steps, which divide each
# gradient by its own magnitude, carry that rounding into the weights of near-zero gradients
# (up to ~4e-5 after four steps).
RING_WEIGHTS_RTOL = 1e-4
# Two of the fsdp_tp runs take the loss from hidden states a chunk of tokens at a time (the
# one-rank baselines take the plain loss): inside FSDP2's root forward at tp 1, and through the
# vocab-sharded lm_head's gather at tp 2; rows straddle the chunks.
CHUNKED = {"fsdp_tp": 24, "ring_tp2": 96}
FSDP_GRAD_NORM_RTOL = 5e-5  # fsdp_tp's norm sums shards' squares; one rank's is the whole gradient's


def train(tmp_path, name: str, *args: str):
    run_dir = tmp_path / name
    result = run_cli([*RUN, *args], run_dir, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
    return run_dir, result


def chunked_loss_tokens(stdout: str) -> int | None:
    """The chunk the plan's fast-paths line names, None for the plain loss."""
    found = re.search(r"chunked loss \((\d+) tokens\)", stdout)
    return int(found[1]) if found else None


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp(min=1e-12))


def assert_equals_one_rank(run_dir, baseline, *, grad_norm_rtol: float = RTOL, weights_rtol: float = RTOL) -> None:
    """Every step's loss and gradient norm, the validation loss and the exported weights of a cp run
    against the one-rank run's."""
    for key in ("loss", "grad_norm", "val_loss"):
        got, want = logged(run_dir, key), logged(baseline, key)
        assert len(got) == len(want) > 0, key
        assert got == pytest.approx(want, rel=grad_norm_rtol if key == "grad_norm" else RTOL), key
    got, want = load_file(run_dir / "hf_export" / "model.safetensors"), load_file(baseline / "hf_export" / "model.safetensors")
    worst = max((relative(got[k], want[k]), k) for k in want)
    assert worst[0] < weights_rtol, worst


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs by name, each trained once for the module: cp1 (one rank, whole sequences: the
    reference), zero2 and zero3 (two ranks, cp 2)."""
    root, done = tmp_path_factory.mktemp("cp"), {}
    fsdp = ["parallel=fsdp_tp", "parallel.tp=1"]
    args = {
        "cp1": ["parallel=zero2", "cluster.devices=1"],
        # full checkpointing around each compiled forward (model/compile.py): the recompute runs
        # Ulysses' exchanges again
        "zero2": ["parallel=zero2", "cluster.devices=2", "parallel.cp=2", "trainer.activation_checkpointing=full", *COMPILED],
        # selective checkpointing replays each layer around the packed documents' cached mask
        # (model/context_parallel.py), its compiled forward inside ZeRO-3's hooks (model/compile.py)
        "zero3": ["parallel=zero3", "cluster.devices=2", "parallel.cp=2", "trainer.activation_checkpointing=selective", *COMPILED],
        "fsdp_cp1": [*fsdp, "cluster.devices=1"],
        "fsdp_tp": [*fsdp, "cluster.devices=2", "parallel.cp=2", f"trainer.loss_chunk_tokens={CHUNKED['fsdp_tp']}"],
        # ring: whole 128-token blocks per rank
        "ring_cp1": [*fsdp, *RING_SEQ, "cluster.devices=1"],
        "ring": [*fsdp, *RING_SEQ, "cluster.devices=2", "parallel.cp=2", "parallel.cp_kind=ring"],
        # auto: ring, Ulysses cannot with tp 2
        "ring_tp2": ["parallel=fsdp_tp", "parallel.tp=2", *RING_SEQ, "cluster.devices=4", "parallel.cp=2", f"trainer.loss_chunk_tokens={CHUNKED['ring_tp2']}"],
        # selective checkpointing recomputes the layer around the ring's gather (the gather again)
        "ring_selective": [*fsdp, *RING_SEQ, "cluster.devices=2", "parallel.cp=2", "parallel.cp_kind=ring", "trainer.activation_checkpointing=selective"],
        # instruction tuning: padded rows (each padded to a multiple of cp), prompts masked from the loss
        "sft_cp1": [*SFT, "parallel=zero2", "cluster.devices=1"],
        "sft_zero2": [*SFT, "parallel=zero2", "cluster.devices=2", "parallel.cp=2"],
        # under ring: rows padded to whole 128-token blocks per rank
        "sft_ring_cp1": [*SFT_RING, *fsdp, "cluster.devices=1"],
        "sft_ring": [*SFT_RING, *fsdp, "cluster.devices=2", "parallel.cp=2", "parallel.cp_kind=ring"],
    }

    def get(name):
        if name not in done:
            done[name] = train(root, name, *args[name])
        return done[name]

    return get


@pytest.mark.parametrize("parallel", ["zero2", "zero3", "fsdp_tp"])
def test_ulysses_over_two_ranks_equals_one_rank(runs, parallel):
    run_dir, result = runs(parallel)
    baseline, _ = runs("fsdp_cp1" if parallel == "fsdp_tp" else "cp1")
    assert "cp 2 (ulysses" in result.stdout and "world size 2 = tp 1 x cp 2 x dp 1" in result.stdout
    assert "rank 0 of a cp group of 2 (DeepSpeed Ulysses, attention sdpa_documents)" in result.stderr + result.stdout
    assert "deepspeed_shm_comm_op built" not in result.stderr + result.stdout  # inference-only, ~50 CPU-s to build
    assert chunked_loss_tokens(result.stdout) == CHUNKED.get(parallel)
    # fsdp_tp's one-rank norm is torch's fp32 norm of whole gradients, off ~1e-5 relative from the
    # per-shard sum (the 4-rank worker below compares every gradient itself to 2.5e-7).
    assert_equals_one_rank(run_dir, baseline, grad_norm_rtol=FSDP_GRAD_NORM_RTOL if parallel == "fsdp_tp" else RTOL)
    # Each token counted once across the cp group: the tokens per step are the one-rank run's.
    per_step = re.compile(r"tokens     (\S+) per step")
    assert per_step.search(result.stdout)[1] == per_step.search(runs("cp1")[1].stdout)[1]


@pytest.mark.parametrize("name, layout", [("ring", "tp 1 x cp 2 x dp 1"), ("ring_tp2", "tp 2 x cp 2 x dp 1"), ("ring_selective", "tp 1 x cp 2 x dp 1")])
def test_ring_over_ranks_equals_one_rank(runs, name, layout):
    """torch's ring under fsdp_tp, packed documents: every step's loss, gradient norm and validation
    loss and the final weights equal one rank's with whole sequences."""
    run_dir, result = runs(name)
    baseline, _ = runs("ring_cp1")
    assert "cp 2 (ring, torch's context parallel" in result.stdout and f"= {layout}" in result.stdout
    assert "rank 0 of a cp group of 2 (torch's ring, SDPA over the block mask" in result.stderr + result.stdout
    assert "under ring (parallel.cp), every layer attends through torch's context parallel instead" in result.stdout
    assert chunked_loss_tokens(result.stdout) == CHUNKED.get(name)
    assert_equals_one_rank(run_dir, baseline, grad_norm_rtol=FSDP_GRAD_NORM_RTOL, weights_rtol=RING_WEIGHTS_RTOL)
    per_step = re.compile(r"tokens     (\S+) per step")
    assert per_step.search(result.stdout)[1] == per_step.search(runs("ring_cp1")[1].stdout)[1]


@pytest.mark.parametrize("name, baseline_name, kind, weights_rtol", [("sft_zero2", "sft_cp1", "ulysses", RTOL), ("sft_ring", "sft_ring_cp1", "ring", RING_WEIGHTS_RTOL)])
def test_instruction_tuning_under_cp_equals_one_rank(runs, name, baseline_name, kind, weights_rtol):
    """Alpaca-format rows, padded (not packed) and with the prompt tokens masked: split over two cp
    ranks, every step's loss and gradient norm and the final weights equal one rank's."""
    run_dir, result = runs(name)
    baseline, _ = runs(baseline_name)
    assert f"cp 2 ({kind}" in result.stdout and "format: instruction" in (run_dir / "config_resolved.yaml").read_text()
    assert_equals_one_rank(run_dir, baseline, grad_norm_rtol=FSDP_GRAD_NORM_RTOL if kind == "ring" else RTOL, weights_rtol=weights_rtol)


@pytest.mark.parametrize(
    "saved_name, baseline_name, resumed_args, converted",
    [
        # DeepSpeed's partitions converted as for a dp change (a universal checkpoint)
        ("zero2", "cp1", ["parallel=zero2", "cluster.devices=1"], "universal"),
        # fsdp_tp's shards, saved by two ring ranks, resharded by the distributed checkpoint
        ("ring", "ring_cp1", ["parallel=fsdp_tp", "parallel.tp=1", *RING_SEQ, "cluster.devices=1"], ""),
    ],
)
def test_a_cp_run_resumes_on_one_rank(tmp_path, runs, saved_name, baseline_name, resumed_args, converted):
    """The cp=2 run's step-2 checkpoint resumed with cp=1 on one rank (a cp change is a data-layout
    change: the data stream is the same) ends as the uninterrupted cp=1 run."""
    import shutil

    saved, _ = runs(saved_name)
    baseline, _ = runs(baseline_name)
    run_dir = tmp_path / "resumed"
    shutil.copytree(saved, run_dir)
    for later in ("step0000004.ckpt", "final.ckpt"):
        shutil.rmtree(run_dir / "checkpoints" / later)
    (run_dir / "checkpoints" / "final.consolidated.ckpt").unlink(missing_ok=True)
    _, result = train(tmp_path, "resumed", *resumed_args, "resume=auto")
    assert "step0000002.ckpt" in result.stdout and converted in result.stdout, result.stdout[-3000:]
    assert logged(run_dir, "loss") == pytest.approx(logged(baseline, "loss"), rel=RTOL)


@pytest.fixture(scope="module")
def four_ranks(tmp_path_factory):
    """tests/integration/cp_worker.py on 4 processes: dp 1 x cp 4 (kv heads replicated: 2 kv heads
    over 4 ranks) and dp 2 x cp 2, each against whole sequences."""
    out = tmp_path_factory.mktemp("cp_worker")
    results = {}
    for cp in (4, 2):
        run_ranks("tests.integration.cp_worker", [str(cp), str(out)], 4, {"OMP_NUM_THREADS": "1"}, local_rank=True)
        results[cp] = torch.load(out / f"cp{cp}_world4_sdpa.pt", weights_only=False)
    return results


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """tests/integration/cp_worker.py on 2 processes (cp 2) for each kernel Ulysses wraps."""
    out = tmp_path_factory.mktemp("cp_kernels")
    results = {}
    for attention in ("sdpa", "varlen", "flash"):
        run_ranks("tests.integration.cp_worker", ["2", str(out), attention], 2, {"OMP_NUM_THREADS": "1"}, local_rank=True)
        results[attention] = torch.load(out / f"cp2_world2_{attention}.pt", weights_only=False)
    return results


@pytest.mark.parametrize("cp", [4, 2])
def test_every_gradient_on_four_ranks_equals_whole_sequences(four_ranks, cp):
    r = four_ranks[cp]
    assert r["params"] > 10
    assert r["grad_gap"] < RTOL, r
    # Packed documents are isolated in the reference the cp run equals: its loss is each document's alone.
    assert r["packed_vs_alone"] < 1e-6, r
    # The cp ranks of a group agree on their loss; with dp 2 the two groups train different batches.
    losses = r["group_losses"]
    assert all(x == pytest.approx(losses[g // cp * cp], rel=1e-6) for g, x in enumerate(losses))
    if cp == 2:
        assert losses[0] != pytest.approx(losses[2], rel=1e-3)
    assert r["host_reads"] == r["cp1_host_reads"]  # the attention reads nothing to the host under cp


@pytest.mark.parametrize("attention", ["sdpa", "varlen", "flash"])
def test_every_kernel_under_ulysses_equals_whole_sequences_reading_no_more_than_cp1(two_ranks, attention):
    """SDPA, torch's varlen kernel and transformers' flash-attn path (the CPU's stand-in kernel
    behind the last two) under Ulysses, each fed the whole rows' boundaries by the training forward:
    every gradient equals whole sequences', and the forward reads to the host (a device sync each on
    a GPU) exactly as often as cp=1's on the same kernel, never once per layer. A flash core keeps
    its name: transformers loads flash kernels by the model's implementation name."""
    r = two_ranks[attention]
    assert r["grad_gap"] < RTOL and r["packed_vs_alone"] < 1e-6, r
    assert r["host_reads"] == r["cp1_host_reads"], r
    assert r["attention"] == {"sdpa": "sdpa_documents", "varlen": "torch_varlen_reference_documents", "flash": "flash_attention_reference"}[attention]

"""The planner knows context (plan/context.py): activation memory per rank falls as 1/cp, the longest
context that fits is printed for the planned cp and twice it, and a context that does not fit is
refused naming the cp that would (tests/unit/test_bad_inputs.py holds the refusals)."""

import pytest

from tests.conftest import compose, plan
from tinytrain.config.schema import Checkpointing
from tinytrain.plan.activations import RECOMPUTE_PEAK, Layout
from tinytrain.plan.checkpointing import BY_COST
from tinytrain.plan.context import ContextPlan, longest_context, with_longest
from tinytrain.plan.memory import activation_memory
from tinytrain.plan.model_shape import ModelShape

LLAMA3_8B = ModelShape(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=128256, tied_embeddings=False, qkv_bias=False)
SHAPE = dict(shape=LLAMA3_8B, layout=Layout.sixteen_bit, micro_batch=1, tp=1)
# docs/parallelism.md's "Long context" command is LONG with parallel.cp=2.
LONG = ["model=llama3_1_8b", "parallel=zero3", "cluster.devices=8", "hardware.gpu=H100", "trainer.micro_batch_size=1", "trainer.global_batch_size=8", "data.seq_len=65536", "trainer.activation_checkpointing=full"]


@pytest.mark.parametrize("checkpointing", list(BY_COST))
def test_activations_per_rank_fall_as_one_over_cp(checkpointing):
    """Ulysses: a rank holds seq / cp tokens between attention calls and attends over all of them
    with heads / cp heads, so on a fused kernel every term falls as 1/cp."""
    one = activation_memory(seq=32768, cp=1, flash=True, checkpointing=checkpointing, **SHAPE)
    for cp in (2, 4, 8):
        assert activation_memory(seq=32768, cp=cp, flash=True, checkpointing=checkpointing, **SHAPE) == pytest.approx(one / cp)


@pytest.mark.parametrize("checkpointing", list(BY_COST))
def test_a_mask_over_the_whole_sequence_stays_whole_under_cp(checkpointing):
    """Without a fused kernel (SDPA with the documents' mask) every rank attends over the whole
    sequence: under cp > 1 one additive 16-bit mask of seq^2 per forward beside what falls as 1/cp
    (at cp 1 transformers' boolean mask, and SDPA's 16-bit copy of it at every layer, and again in
    the last layer's recompute). With liger's fused loss (no logits) the recompute is the backward's
    peak."""
    seq, fused_loss = 32768, dict(SHAPE, logits_tokens=0)
    for cp in (2, 4, 8):
        masked = activation_memory(seq=seq, cp=cp, flash=False, checkpointing=checkpointing, **fused_loss)
        assert masked - activation_memory(seq=seq, cp=cp, flash=True, checkpointing=checkpointing, **fused_loss) == pytest.approx(2.0 * seq * seq)
    layers_kept = {Checkpointing.none: 32, Checkpointing.selective: RECOMPUTE_PEAK, Checkpointing.full: RECOMPUTE_PEAK}[checkpointing]
    at_one = activation_memory(seq=seq, cp=1, flash=False, checkpointing=checkpointing, **fused_loss) - activation_memory(seq=seq, cp=1, flash=True, checkpointing=checkpointing, **fused_loss)
    assert at_one == pytest.approx((layers_kept * 2.0 + 1.0) * seq * seq)  # the recompute's mask: RECOMPUTE_PEAK x a layer's


@pytest.mark.parametrize("logits_tokens", [None, 1024], ids=["plain", "chunked"])
def test_checkpointing_keeps_a_layer_input_and_peaks_at_the_loss_or_one_layer(logits_tokens):
    """The backward's peak is the loss's (its fp32 log-softmax and two gradients, 12 B per vocab
    row, while every layer's activations are held) or, under checkpointing, the last layer's
    recompute, whichever is larger: the loss's ends before the recompute begins."""
    none = activation_memory(seq=8192, flash=True, logits_tokens=logits_tokens, **SHAPE)
    full = activation_memory(seq=8192, flash=True, checkpointing=Checkpointing.full, logits_tokens=logits_tokens, **SHAPE)
    # 16-bit (DeepSpeed): per token and layer 16 h + 4 (q + kv) + 8 I + 4 per head (plan/activations.py)
    per_layer, loss = (16 * 4096 + 4 * (4096 + 1024) + 8 * 14336 + 4 * 32) * 8192, (logits_tokens or 8192) * 128256 * 12
    ends = (8 * 4096 + 2 * 128 * 2) * 8192  # the final norm and RoPE's cos and sin
    assert per_layer / 8192 / 4096 == pytest.approx(49.03, abs=0.01)  # Korthikanti's GPT layer: 34
    assert none == pytest.approx(32 * per_layer + ends + loss)
    assert full == pytest.approx(32 * 2.0 * 8192 * 4096 + max(ends + loss, RECOMPUTE_PEAK * per_layer))
    assert (ends + loss > RECOMPUTE_PEAK * per_layer) is (logits_tokens is None)  # the plain loss's 12.6 GB; a chunk's 1.58 and the ends' 0.27, below a layer's recompute's 2.14


def test_the_longest_context_is_the_last_step_that_fits():
    def at(seq, cp):
        return 1000.0 * seq / cp

    longest = longest_context(at, gpu_bytes=1000.0 * 10_000, cp=2)
    assert longest == 18432 and at(longest, 2) <= 1e7 < at(longest + 2048, 2)  # steps of 1024 x cp
    cfg = compose(["data.seq_len=4096"])  # 6 heads, 2 kv heads: cp 4 splits no whole heads
    plan_ = with_longest(cfg, ContextPlan(1, "none", "", 0), at, gpu_memory_gb=1000.0 * 10_000 / 1e9, world=2)
    assert plan_.longest == ((1, 9216), (2, 18432)) and plan_.longest_gpus == ()
    # Twice cp 2 is cp 4, which Ulysses cannot split 6 heads over: only cp 2's longest is given.
    assert with_longest(cfg, ContextPlan(2, "ulysses", "", 0), at, gpu_memory_gb=1000.0 * 10_000 / 1e9, world=2).longest == ((2, 18432),)
    assert with_longest(cfg, ContextPlan(1, "none", "", 0), at, gpu_memory_gb=None, world=2).longest == ()
    # On one GPU, cp 2 needs two: said beside its longest.
    assert with_longest(cfg, ContextPlan(1, "none", "", 0), at, gpu_memory_gb=1000.0 * 10_000 / 1e9, world=1).longest_gpus == ((2, 2),)


def test_ring_counts_the_keys_and_values_each_rank_gathers(tmp_path):
    """Ring: a rank's queries attend to keys and values gathered over the cp group, which every
    layer keeps for its backward: the plan holds (cp - 1) / cp x seq more tokens of them per layer
    than Ulysses at the same layout (fsdp_tp, tp 1, heads cp divides), and names ring's kernel."""
    from tinytrain.config.dtype import Dtype
    from tinytrain.plan.activations import layout_of, ring_gather_bytes

    args = ["model=llama3_1_8b", "parallel=fsdp_tp", "parallel.tp=1", "cluster.devices=8", "hardware.gpu=H200", "trainer.micro_batch_size=1", "trainer.global_batch_size=8", "data.seq_len=32768", "parallel.cp=4", "trainer.activation_checkpointing=none"]
    ulysses = plan([*args, "parallel.cp_kind=ulysses"], tmp_path / "ulysses")
    ring = plan([*args, "parallel.cp_kind=ring"], tmp_path / "ring")
    assert (ulysses["context"]["kind"], ring["context"]["kind"]) == ("ulysses", "ring")
    layout = layout_of(Dtype.bf16, False)
    gathered = 32 * ring_gather_bytes(LLAMA3_8B, layout, seq=32768, cp=4, tp=1)
    assert gathered / 2**30 == pytest.approx(3.0)  # 32 layers x 2 x 1024 wide x 2 B x 24576 tokens
    extra = (ring["memory_per_gpu"]["activations_gib"] - ulysses["memory_per_gpu"]["activations_gib"]) * 2**30
    assert extra == pytest.approx(gathered, rel=1e-3)


def test_a_long_context_plan_prints_the_split_and_the_longest_fit(tmp_path):
    one = plan(LONG, tmp_path / "cp1")
    two = plan([*LONG, "parallel.cp=2"], tmp_path / "cp2")
    assert one["context"]["kind"] == "none" and two["context"]["kind"] == "ulysses"
    assert two["parallel"] == {**one["parallel"], "cp": 2, "dp": one["parallel"]["dp"] // 2}
    assert two["context"]["local_seq_len"] == 32768
    assert two["memory_per_gpu"]["activations_gib"] == pytest.approx(one["memory_per_gpu"]["activations_gib"] / 2, rel=1e-3)
    # The longest at cp 2 is what cp 1's plan printed for twice its cp.
    assert two["context"]["longest"]["2"] == one["context"]["longest"]["2"] > 65536
    assert two["tokens_per_step"] == one["tokens_per_step"] == 8 * 65536  # the global batch's tokens, each counted once
    assert two["batch"]["accumulate_grad_batches"] == 2 * one["batch"]["accumulate_grad_batches"]
    assert two["deepspeed"]["train_batch_size"] == 16  # DeepSpeed counts all 8 ranks as data-parallel
    # Beyond the model's positions: Llama-3.1's reach counts its scaling already; an unscaled
    # model's would need one.
    assert two["context"]["scaled"] and not plan([*LONG, "parallel.cp=2", "model.rope_scaling=null", "data.seq_len=8192"], tmp_path / "plain")["context"]["scaled"]


def test_cp_null_picks_the_smallest_cp_that_fits(tmp_path):
    """parallel.cp=null: the plan picks the smallest cp the heads and world allow whose estimate fits
    under 90% of the GPU, and the batch's dp and accumulation follow it."""
    long = plan([*LONG, "data.seq_len=393216", "model.max_position_embeddings=524288", "parallel.cp=null"], tmp_path / "a")
    assert long["parallel"]["cp"] == 4 and long["parallel"]["dp"] == 2 and long["batch"]["accumulate_grad_batches"] == 4
    assert "parallel.cp=null: 4, the smallest cp whose estimate fits" in long["context"]["reason"]
    assert long["memory_per_gpu"]["total_gib"] <= 0.9 * long["memory_per_gpu"]["gpu_memory_gib"]
    short = plan([*LONG, "parallel.cp=null"], tmp_path / "b")
    assert short["parallel"]["cp"] == 1 and "the smallest cp whose estimate fits" in short["context"]["reason"]
    cpu = plan(["parallel.cp=null"], tmp_path / "c")
    assert cpu["parallel"]["cp"] == 1 and "parallel=single has no context parallelism" in cpu["context"]["reason"]


def test_cp_null_lays_out_the_global_batch_over_the_cp_it_chooses(tmp_path):
    """A global batch of 4 on 8 GPUs holds one sequence per data-parallel rank at cp 2, none at cp 1:
    parallel.cp=null passes over a cp whose data parallelism does not divide the batch, and says so
    (it was refused at cp 1, the cp never chosen). Where memory asks for a larger cp, nothing is
    passed over."""
    recipe = ["experiment=long_context", "cluster.devices=8", "trainer.global_batch_size=4"]
    h100 = plan([*recipe, "hardware.gpu=H100"], tmp_path / "h100")
    assert h100["parallel"]["cp"] == 2 and h100["parallel"]["dp"] == 4 and h100["batch"]["accumulate_grad_batches"] == 1
    assert "cp 1 would fit but cannot lay out trainer.global_batch_size=4 (data parallel 8)" in h100["context"]["reason"]
    a10 = plan([*recipe, "hardware.gpu=A10"], tmp_path / "a10")
    assert a10["parallel"]["cp"] == 4 and "cannot lay out" not in a10["context"]["reason"]
    unsized = plan(recipe, tmp_path / "cpu")
    assert unsized["parallel"]["cp"] == 2 and "no GPU memory" in unsized["context"]["reason"] and "cp 1 cannot lay out" in unsized["context"]["reason"]


@pytest.mark.parametrize(("gpu", "cp"), [("H100", 1), ("A10", 4), ("V100", 2)])
def test_the_long_context_recipe_sizes_cp_to_the_gpu(tmp_path, gpu, cp):
    """experiment=long_context: Llama-3-8B's shape at 4x its 8192 positions with llama3 RoPE scaling,
    Ulysses under ZeRO-3 at the cp the plan picks: none on 80 GB H100s, 4 on 24 GB A10s, 2 on 32 GB
    V100s (no varlen kernel: SDPA keeps one 32k x 32k mask per forward; 4 sequences a micro batch
    are refused at cp 8 in tests/unit/test_bad_inputs.py)."""
    p = plan(["experiment=long_context", f"hardware.gpu={gpu}", "cluster.devices=8"], tmp_path / gpu)
    assert p["parallel"]["cp"] == cp and p["batch"]["seq_len"] == 32768
    assert p["preflight"]["findings"] == [] or all(f["severity"] != "error" for f in p["preflight"]["findings"])


@pytest.mark.parametrize(
    "args, cp, kind, why",
    [
        (["parallel=zero2"], 2, "ulysses", "auto: parallel=zero2 runs ulysses"),
        (["parallel=fsdp_tp", "parallel.tp=1", "model.num_heads=4", "model.num_kv_heads=2"], 4, "ulysses", "auto: ulysses, since tp 1 and cp(4) splits whole heads (ring where they do not)"),
        (["parallel=fsdp_tp", "parallel.tp=2"], 2, "ring", "auto: ring, since Ulysses cannot: tp 2 takes the consecutive ranks its groups need under parallel=fsdp_tp"),
        (["parallel=fsdp_tp", "parallel.tp=1", "model.num_heads=6", "model.num_kv_heads=3"], 4, "ring", "auto: ring, since Ulysses cannot: cp(4) does not divide num_heads(6); cp(4) and num_kv_heads(3) do not divide one another"),
        (["parallel=fsdp_tp", "parallel.tp=1", "parallel.cp_kind=ring"], 2, "ring", "as configured (parallel.cp_kind=ring)"),
    ],
)
def test_auto_picks_ulysses_where_it_splits_and_ring_where_it_cannot(args, cp, kind, why):
    """cp_kind=auto per strategy and heads: DeepSpeed runs Ulysses only; fsdp_tp runs Ulysses with
    tp 1 and whole heads per rank, ring otherwise (the reason says why)."""
    from tinytrain.plan.context import choose_kind

    assert choose_kind(compose(args), cp) == (kind, why)


def test_auto_picks_ring_under_fsdp_tp_where_deepspeed_is_not_installed(monkeypatch):
    """Ulysses is DeepSpeed's, under fsdp_tp too; ring is torch's own: without the deepspeed extra
    auto picks ring, and an explicit ulysses names the install."""
    import importlib.util

    from tinytrain.plan.context import choose_kind, problems

    auto = compose(["parallel=fsdp_tp", "parallel.tp=1", "cluster.devices=2", "parallel.cp=2", "data.seq_len=256"])
    ulysses = compose(["parallel=fsdp_tp", "parallel.tp=1", "cluster.devices=2", "parallel.cp=2", "data.seq_len=256", "parallel.cp_kind=ulysses"])
    assert choose_kind(auto, 2)[0] == "ulysses"
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None if name == "deepspeed" else real(name, *args))
    assert choose_kind(auto, 2) == ("ring", "auto: ring, since Ulysses cannot: DeepSpeed, whose Ulysses it is, is not installed")
    assert problems(auto) == []
    assert [(p.key, p.fix) for p in problems(ulysses)] == [("parallel.cp", "pip install 'tinytrain-llm[deepspeed]'")]


@pytest.mark.parametrize("version, refused", [("0.19.6", True), ("0.19.7", False), ("0.19.8", False)])
def test_ulysses_in_compiled_blocks_needs_the_deepspeed_that_gives_q_k_v_gradients(monkeypatch, version, refused):
    """Before DeepSpeed 0.19.7 its Ulysses exchange inside compiled layers gave q, k and v no
    gradient (DeepSpeed PR 8491): with compiled blocks an older DeepSpeed is refused under the ZeRO
    strategies naming the upgrade, and fsdp_tp's auto picks ring instead; eager runs are untouched."""
    from tinytrain.plan import context

    monkeypatch.setattr(context, "deepspeed_version", lambda: version)
    common = ["cluster.devices=2", "parallel.cp=2", "data.seq_len=256"]
    compiled = ["trainer.compile=blocks", "trainer.compile_backend=aot_eager"]
    found = context.problems(compose(["parallel=zero2", *common, *compiled]))
    assert [(p.key, p.fix) for p in found] == ([("trainer.compile", "pip install 'deepspeed>=0.19.7', or trainer.compile=none")] if refused else [])
    if refused:
        assert f"DeepSpeed {version}'s Ulysses exchange gives compiled layers no gradient for q, k and v" in found[0].message
    assert context.problems(compose(["parallel=zero2", *common])) == []
    fsdp = compose(["parallel=fsdp_tp", "parallel.tp=1", *common, *compiled])
    assert context.choose_kind(fsdp, 2)[0] == ("ring" if refused else "ulysses")
    explicit = context.problems(compose(["parallel=fsdp_tp", "parallel.tp=1", *common, *compiled, "parallel.cp_kind=ulysses"]))
    assert [p.fix for p in explicit] == (["pip install 'deepspeed>=0.19.7', or trainer.compile=none, or parallel.cp_kind=ring"] if refused else [])


def test_cp_null_chooses_only_among_cps_a_trainable_kind_splits():
    """Ring does not train yet, so parallel.cp=null never lands on a cp only ring could split."""
    from tinytrain.plan.context import allowed_cps

    assert allowed_cps(compose(["parallel=fsdp_tp", "parallel.tp=1", "model.num_heads=4", "model.num_kv_heads=2"]), 4) == [1, 2, 4]
    assert allowed_cps(compose(["parallel=fsdp_tp", "parallel.tp=2", "model.num_heads=4", "model.num_kv_heads=2"]), 4) == [1]
    # Ring splits where Ulysses cannot (tp 2), in whole 128-token blocks per rank.
    assert allowed_cps(compose(["parallel=fsdp_tp", "parallel.tp=2", "data.seq_len=512"]), 8) == [1, 2, 4]
    assert allowed_cps(compose(["parallel=fsdp_tp", "parallel.tp=2", "data.seq_len=512", "parallel.cp_kind=ulysses"]), 8) == [1]


def test_each_problem_is_named_once():
    from tinytrain.plan.context import problems

    found = problems(compose(["parallel=zero2", "cluster.devices=2", "parallel.cp=2", "data.seq_len=255"]))
    assert [p.key for p in found] == ["data.seq_len"]
    ring = problems(compose(["parallel=fsdp_tp", "parallel.tp=2", "cluster.devices=4", "parallel.cp=2", "data.seq_len=384"]))
    assert [p.key for p in ring] == ["data.seq_len"]
    padded = problems(compose(["parallel=fsdp_tp", "parallel.tp=2", "cluster.devices=4", "parallel.cp=2", "data=alpaca", "data.seq_len=512"]))
    assert [(p.key, p.fix) for p in padded] == [("data.pad_to_multiple_of", "use data.pad_to_multiple_of=256")]
    # A kind the strategy does not run: its fix changes the kind, so that kind's rules are not asked too.
    unrun = problems(compose(["parallel=zero2", "cluster.devices=2", "parallel.cp=2", "parallel.cp_kind=ring", "model.num_heads=4", "model.num_kv_heads=2"]))
    assert [p.key for p in unrun] == ["parallel.cp_kind"]


def test_a_cp_the_world_cannot_hold_is_named_without_the_kind_its_tp_would_pick():
    """cp 2 beside tp 2 on 2 GPUs: the fix (tp 1) lets auto pick Ulysses, so ring's seq_len rule
    (128-token blocks per rank, asked because tp 2 rules Ulysses out) is not asked as well."""
    from tinytrain.errors import ConfigError
    from tinytrain.plan.validate import validate

    with pytest.raises(ConfigError) as refused:
        validate(compose(["parallel=fsdp_tp", "parallel.tp=2", "cluster.devices=2", "parallel.cp=2"]))
    assert [p.key for p in refused.value.problems] == ["parallel.cp"], refused.value


def test_the_plan_line_for_ring_names_torch_s_engine_and_its_proof():
    """What mode=plan prints for ring: torch's engine and what proved it."""
    from tinytrain.plan.context import choose, render

    cfg = compose(["parallel=fsdp_tp", "parallel.tp=2", "data.seq_len=4096"])
    lines = render(choose(cfg, 2).to_dict(), 4096)
    assert lines[0].startswith("context    cp 2 (ring, torch's context parallel, flex-attention path")
    assert "auto: ring, since Ulysses cannot: tp 2" in lines[0] and "each rank holds 2048 of 4096 tokens" in lines[0]
    assert lines[1].startswith("           proven: equal to cp=1 in loss and gradients on CPU over gloo with packed documents, its kernel there SDPA")
    assert lines[1].endswith("the GPU's compiled flex kernel not yet (benchmarks/gpu_check.py part e)")


def test_the_docs_memory_table_is_what_the_plan_prints(tmp_path):
    """docs/parallelism.md's table of Llama-3.1-8B's memory per GPU by GPUs, seq_len and cp, each
    cell planned again."""
    from pathlib import Path

    from tinytrain.errors import ConfigError

    doc = (Path(__file__).resolve().parents[3] / "docs" / "parallelism.md").read_text()
    rows = [line.strip("|").split("|") for line in doc.splitlines() if line.startswith(("| 8 | ", "| 16 | "))]
    assert len(rows) == 6
    for gpus, seq, *cells in rows:
        for cp, cell in zip((1, 2, 4, 8), cells):
            args = [*LONG[:1], "model.vocab_size=128256", "parallel=zero3", "hardware.gpu=H100", "trainer.micro_batch_size=1", "trainer.activation_checkpointing=full"]
            args += [f"cluster.devices={gpus.strip()}", f"trainer.global_batch_size={gpus.strip()}", f"data.seq_len={int(seq.strip()[:-1]) * 1024}", f"parallel.cp={cp}"]
            folder = tmp_path / f"{gpus.strip()}_{seq.strip()}_{cp}"
            if cell.strip().startswith("over"):  # "over (79.0)": refused, naming what it needs
                with pytest.raises(ConfigError, match=rf"does not fit at parallel.cp={cp}: {cell.strip()[6:-1]} GiB needed"):
                    plan(args, folder)
                continue
            printed = f"{plan(args, folder)['memory_per_gpu']['total_gib']:.1f}"
            assert cell.strip().removesuffix(" GiB") == printed, (gpus, seq, cp)


def test_a_chunked_loss_holds_one_chunk_of_logits_not_the_context_s(tmp_path):
    """Llama-3's 128,256-row vocab turns the chunked loss on (plan/fast_paths.py): at 64k tokens the
    estimate holds one 1024-token chunk's fp32 log-softmax and its gradients (1.5 GiB, below the last
    layer's recompute), not every token's (94 GiB), so the context fits at cp 1; with the plain loss
    it does not."""
    from tinytrain.errors import ConfigError

    vocab = ["model.vocab_size=128256"]
    chunked = plan([*LONG, *vocab, "parallel.cp=1"], tmp_path / "chunked")
    assert chunked["fast_paths"]["loss_chunk_tokens"] == 1024 and chunked["memory_per_gpu"]["fits"]
    shape = ModelShape(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, vocab=chunked["vocab"]["padded"], tied_embeddings=False, qkv_bias=False)
    expected = activation_memory(shape=shape, layout=Layout.sixteen_bit, seq=65536, micro_batch=1, tp=1, flash=True, checkpointing=Checkpointing.full, logits_tokens=1024) / 2**30
    assert chunked["memory_per_gpu"]["activations_gib"] == pytest.approx(expected, abs=0.01)
    with pytest.raises(ConfigError, match="does not fit at parallel.cp=1"):
        plan([*LONG, *vocab, "parallel.cp=1", "trainer.loss_chunk_tokens=0"], tmp_path / "plain")


def test_fsdp_tp_at_128k_holds_one_chunk_of_logits_not_the_shard_s(tmp_path):
    """docs/parallelism.md's fsdp_tp figures: Llama-3.1-8B's vocab at 128k tokens on 16 H100s, tp 2 x
    cp 8. The chunked loss (on by default for a 128,256-row vocab) holds one chunk's logits; the
    plain loss holds the rank's 16k tokens' logits, gathered whole over tp."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[3] / "docs" / "parallelism.md").read_text()
    command = re.search(r"python -m tinytrain (mode=plan model=llama3_1_8b model.vocab_size=128256 parallel=fsdp_tp [^\n]*)", doc)[1].split()
    chunked = plan(command, tmp_path / "chunked")
    whole = plan([*command, "trainer.loss_chunk_tokens=0"], tmp_path / "whole")
    assert chunked["fast_paths"]["loss_chunk_tokens"] == 1024 and whole["fast_paths"]["loss_chunk_tokens"] == 0
    figures = [f"{chunked['memory_per_gpu']['total_gib']:.2f} GiB per GPU, {chunked['memory_per_gpu']['activations_gib']:.2f} of it activations", f"cp 8\n{chunked['context']['longest']['8']:,} tokens"]
    figures += [f"plans {whole['memory_per_gpu']['total_gib']:.2f} GiB", f"of its {whole['memory_per_gpu']['activations_gib']:.1f} GiB of activations", f"longest context is {whole['context']['longest']['8']:,} tokens"]
    flat = " ".join(doc.split())
    for figure in figures:
        assert " ".join(figure.split()) in flat, figure
    assert chunked["memory_per_gpu"]["total_gib"] < 0.6 * whole["memory_per_gpu"]["total_gib"]

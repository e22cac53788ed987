"""The weighted mixture's batch sampler: frequencies by weight, whole passes per source, exact
resume per source, the same stream on any number of data-parallel ranks, and the exhaustion check."""

import math
import zlib

import numpy as np
import pytest

from tinytrain.data import mixture_sampler
from tinytrain.data.mixture_sampler import MixtureBatchSampler

NAMES = ["big", "small", "medium"]
SIZES = [500, 40, 200]
WEIGHTS = [6.0, 1.0, 3.0]  # relative: shares 0.6, 0.1, 0.3
BATCH = 8


def sampler(seed=1234, weights=WEIGHTS, sizes=SIZES, batch=BATCH) -> MixtureBatchSampler:
    return MixtureBatchSampler(NAMES, sizes, weights, batch, seed)


def train(s: MixtureBatchSampler, n: int) -> list[list[int]]:
    """n batches as the training loop takes them: a new iterator per epoch, each batch counted
    (advance) after it is trained on."""
    out: list[list[int]] = []
    while len(out) < n:
        for batch in s:
            out.append(batch)
            s.advance()
            if len(out) == n:
                break
    return out


def source_of(index: int, sizes=SIZES) -> int:
    return int(np.searchsorted(np.cumsum(sizes), index, side="right"))


# The bound: each sample comes from source k independently with probability p_k, so over n samples
# the count c_k is Binomial(n, p_k). |c_k - n p_k| <= Z sqrt(n p_k (1 - p_k)) fails with probability
# about 2 (1 - Phi(Z)) = 5.7e-7 at Z = 5 for each source, so below 2e-6 for the three together (union
# bound). The seeds are fixed, so the test is deterministic; the bound says it is not tuned to them.
Z = 5.0


@pytest.mark.parametrize("seed", [0, 1, 1234])
def test_source_frequencies_over_n_batches_match_the_weights_within_a_binomial_bound(seed):
    n_batches = 1000
    batches = train(sampler(seed), n_batches)
    n = n_batches * BATCH
    counts = np.bincount([source_of(i) for b in batches for i in b], minlength=len(NAMES))
    shares = np.asarray(WEIGHTS) / sum(WEIGHTS)
    for k, p in enumerate(shares):
        bound = Z * math.sqrt(n * p * (1 - p))
        assert abs(counts[k] - n * p) <= bound, (NAMES[k], counts[k], n * p, bound)
        # Tight enough to catch a sampler whose share of any source is off by a quarter.
        assert bound < 0.25 * n * p


def test_each_source_is_read_in_whole_shuffled_passes():
    batches = train(sampler(), 300)  # 2,400 samples: 'small' (40 items, 10%) goes round ~6 times
    drawn = {k: [] for k in range(len(NAMES))}
    for i in (i for b in batches for i in b):
        drawn[source_of(i)].append(i)
    for k, size in enumerate(SIZES):
        items = drawn[k]
        full = len(items) // size
        assert full >= (6 if k == 1 else 1)
        passes = [items[p * size : (p + 1) * size] for p in range(full)]
        offset = sum(SIZES[:k])
        for one_pass in passes:  # every item once per pass, nothing repeated before all are seen
            assert sorted(one_pass) == list(range(offset, offset + size))
        assert passes[0] != passes[1]  # each pass is shuffled anew


def test_mapped_pass_orders_and_a_stream_computed_in_chunks_give_the_same_batches(tmp_path, monkeypatch):
    """Memory that does not grow with the data: each source's pass orders written once and mapped,
    the stream computed a few batches at a time (the training step's checks in between), on two
    ranks: the same batches as the whole epoch's stream computed at once in memory."""
    reference = train(sampler(), 200)  # 92 batches per epoch: crosses one
    monkeypatch.setattr(mixture_sampler, "CHUNK", 3 * BATCH)
    ranks = [MixtureBatchSampler(NAMES, SIZES, WEIGHTS, BATCH, 1234, order_folders=[tmp_path / name for name in NAMES]) for _ in range(2)]
    for r, s in enumerate(ranks):
        s.set_shard(r, 2)
    out, iters = [], [iter(s) for s in ranks]
    while len(out) < 200:
        for k, it in enumerate(iters):
            batch = next(it, None)
            if batch is None:  # the epoch's end: the training loop starts the next
                iters[k] = it = iter(ranks[k])
                batch = next(it)
            out.append(batch)
        for s in ranks:
            s.advance()
            s.first_exhausted(2), s.state_dict()  # the step's cursor, behind the iterator's
    assert out == reference
    small = ranks[0]._orders[1]
    assert isinstance(small(0), np.memmap) and sorted(p.name for p in (tmp_path / "small").glob("*.npy"))[:2] == [f"order-n40-seed1234-{zlib.crc32(b'small')}-epoch{p}.npy" for p in (0, 1)]


def test_a_resumed_sampler_continues_every_source_exactly():
    reference = train(sampler(), 250)  # crosses the nominal epoch boundary (92 batches per epoch)
    first = sampler()
    before = train(first, 137)
    state = first.state_dict()
    # The checkpoint's per-source positions are the samples drawn from each source so far.
    counts = np.bincount([source_of(i) for b in before for i in b], minlength=len(NAMES))
    assert {name: s["position"] for name, s in state["sources"].items()} == dict(zip(NAMES, counts.tolist()))
    assert state["samples"] == 137 * BATCH
    small = state["sources"]["small"]
    assert (small["pass"], small["in_pass"]) == divmod(int(counts[1]), 40)
    resumed = sampler()
    resumed.load_state_dict(state)
    assert before + train(resumed, 250 - 137) == reference


def test_ranks_split_the_same_stream_and_resume_on_another_world_size():
    reference = train(sampler(), 120)
    ranks = [sampler(), sampler()]
    for r, s in enumerate(ranks):
        s.set_shard(r, 2)

    def step(n):  # both ranks train a batch, then each counts the two global batches
        out = []
        iters = [iter(s) for s in ranks]
        for _ in range(n):
            out += [next(it) for it in iters]
            for s in ranks:
                s.advance()
        return out

    together = step(30)  # within the first epoch (92 batches)
    assert together == reference[:60]
    state = ranks[0].state_dict()
    assert state == ranks[1].state_dict()
    alone = sampler()
    alone.load_state_dict(state)
    assert train(alone, 60) == reference[60:]


def test_new_weights_continue_each_source_from_its_position():
    first = sampler()
    before = train(first, 50)
    state = first.state_dict()
    reweighted = sampler(weights=[1.0, 8.0, 1.0])
    reweighted.load_state_dict(state)
    after = train(reweighted, 50)
    small = [i for b in before + after for i in b if source_of(i) == 1]
    counts = np.bincount([source_of(i) for b in after for i in b], minlength=len(NAMES))
    assert counts[1] > counts[0] + counts[2]  # drawn by the new weights
    # 'small' went on where it was: its first pass has no repeat.
    assert len(set(small[:40])) == 40


def test_first_exhausted_names_the_source_whose_first_pass_the_next_batches_would_exceed():
    s = sampler()
    step = 0
    while s.first_exhausted(1) is None:
        train(s, 1)
        step += 1
    assert s.first_exhausted(1) == 1  # 'small': 40 items at 10% of 8 samples a batch
    drawn = [i for b in train(sampler(), step + 1) for i in b]
    small_before = sum(source_of(i) == 1 for i in drawn[: step * BATCH])
    small_after = sum(source_of(i) == 1 for i in drawn)
    assert small_before <= 40 < small_after


def test_every_source_needs_an_item():
    with pytest.raises(ValueError, match="at least one item"):
        MixtureBatchSampler(["a", "b"], [10, 0], [1.0, 1.0], 4, 0)


def test_positions_of_the_other_kind_start_from_the_first_batch(caplog):
    from tinytrain.data.sampler import ResumableBatchSampler

    mixed = sampler()
    train(mixed, 10)
    single = ResumableBatchSampler(100, BATCH, 1234)
    single.load_state_dict(mixed.state_dict())
    assert (single.epoch, single.consumed) == (0, 0) and "a mixture's (big, small, medium)" in caplog.text
    fresh = sampler()
    fresh.load_state_dict(single.state_dict())
    assert train(fresh, 3) == train(sampler(), 3) and "not a mixture's" in caplog.text


# Three data stages over 900 optimizer steps of one batch of 8: the weights change at steps 300 and 600.
STAGES = [(300, [1.0, 0.0, 0.0]), (600, [1.0, 1.0, 2.0]), (None, [0.0, 3.0, 1.0])]


def staged(seed=1234, stages=STAGES) -> MixtureBatchSampler:
    return MixtureBatchSampler(NAMES, SIZES, WEIGHTS, BATCH, seed, stages, samples_per_step=BATCH)


@pytest.mark.parametrize("seed", [0, 1234])
def test_each_data_stage_draws_its_own_shares_within_a_binomial_bound(seed):
    batches = train(staged(seed), 900)
    for (start, end), (_, weights) in zip([(0, 300), (300, 600), (600, 900)], STAGES):
        n = (end - start) * BATCH
        counts = np.bincount([source_of(i) for b in batches[start:end] for i in b], minlength=len(NAMES))
        for k, p in enumerate(np.asarray(weights) / sum(weights)):
            bound = Z * math.sqrt(n * p * (1 - p))
            assert abs(counts[k] - n * p) <= bound, (start, NAMES[k], counts[k], n * p, bound)
            assert p in (0.0, 1.0) or bound < 0.25 * n * p


def test_one_stage_draws_what_the_weights_alone_draw():
    """Stages map the same uniforms through each stage's weights: a run without stages (and a
    checkpoint from before they existed) draws exactly as before."""
    assert train(MixtureBatchSampler(NAMES, SIZES, WEIGHTS, BATCH, 7, [(None, WEIGHTS)], BATCH), 200) == train(sampler(7), 200)


def test_a_resume_across_a_stage_boundary_is_exact_and_a_changed_later_stage_is_logged(caplog):
    reference = train(staged(), 400)
    first = staged()
    before = train(first, 290)  # stage 0; the resumed run crosses into stage 1 at step 300
    state = first.state_dict()
    assert [s["until_step"] for s in state["stages"]] == [300, 600, None]
    resumed = staged()
    resumed.load_state_dict(state)
    assert before + train(resumed, 110) == reference
    assert "data stages changed" not in caplog.text
    # The last stage changed while the run is in stage 0: allowed, logged, and stage 1 is as before.
    changed = staged(stages=[*STAGES[:2], (None, [1.0, 1.0, 1.0])])
    changed.load_state_dict(state)
    assert train(changed, 310) == reference[290:400] + train(staged(), 600)[400:600]
    assert "data stages changed since the checkpoint (step 290)" in caplog.text


def test_an_epoch_is_whole_optimizer_steps_and_each_step_s_batches_are_known():
    """With accumulation, the nominal epoch ends on a whole step (92 batches -> 90 in steps of 3, so
    no step's accumulation runs into the next epoch), and current_step gives every rank's batches of
    the step the next batch belongs to (train/callbacks/step_tokens.py weighs the step's tokens)."""
    ranks = [sampler(), sampler()]
    for r, s in enumerate(ranks):
        s.set_shard(r, 2)
        s.accumulation = 3
    assert ranks[0].epoch_batches == 90  # 92 cut to whole steps of 2 ranks x 3
    trained, steps, per_epoch, keys = [], [], [], []
    while len(trained) < 2 * 51:  # 51 rounds, 17 steps: over an epoch's end (45 rounds)
        rounds = 0
        for batches in zip(*ranks):
            steps.append([s.current_step() for s in ranks])
            keys.append(ranks[0].step_key())
            trained.extend(batches)
            for s in ranks:
                s.advance()
            rounds += 1
            if len(trained) == 2 * 51:
                break
        per_epoch.append(rounds)
    assert per_epoch == [45, 6]
    for i, (step_0, step_1) in enumerate(steps):
        first = i // 3 * 3 * 2  # the step's first global batch: 3 rounds of 2 ranks a step
        assert step_0 == step_1 == trained[first : first + 6], i
    # step_key: the same through a step, another at the next (StepTokens reads a step once).
    assert all((keys[i] == keys[j]) == (i // 3 == j // 3) for i in range(len(keys)) for j in range(len(keys)))


def test_a_position_saved_in_batches_of_another_size_continues_at_the_batch_holding_it(caplog):
    """42 samples trained in batches of 6, resumed in batches of 8: the stream continues at sample 40
    (the batch holding sample 42), samples 40 and 41 trained again, as the single-source sampler does.
    Before, the run continued at sample 40 with each source's position at sample 42: the counter
    lagged the samples trained, and those two draws took the next items."""
    reference = train(sampler(batch=8), 12)
    first = sampler(batch=6)
    train(first, 7)
    resumed = sampler(batch=8)
    with caplog.at_level("INFO"):
        resumed.load_state_dict(first.state_dict())
    assert "the 2 sample(s) before sample 42 are trained again" in caplog.text
    assert train(resumed, 7) == reference[5:12]

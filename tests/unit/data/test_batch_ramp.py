"""trainer.batch_size_warmup: the ramp's batches, the samples each rank draws, exact resume inside
the ramp (also on another data-parallel size), and the schedule counted in tokens."""

import numpy as np
import pytest

from tinytrain.config.schema import DecayShape, LrSchedule
from tinytrain.data.batch_ramp import BatchRamp
from tinytrain.data.ramp_sampler import RampBatchSampler
from tinytrain.plan.schedule import Schedule

# 2 -> 6 sequences in increments of 2 (dp 2 x accumulation 1) over 8 samples: 2 increments of 4 samples.
RAMP = BatchRamp(start=2, final=6, increment=2, samples=8, seq_len=16)


def test_batches_follow_the_hand_computed_ramp():
    # step: samples before it -> batch: 0 -> 2, 2 -> 2, 4 -> 2 + (4 // 4) x 2 = 4, 8 -> 6 (final)
    assert RAMP.steps == (2, 2, 4)
    assert [RAMP.batch(k) for k in range(6)] == [2, 2, 4, 6, 6, 6]
    assert [RAMP.micro(k) for k in range(5)] == [1, 1, 2, 3, 3]
    assert [RAMP.samples_before(k) for k in range(6)] == [0, 2, 4, 8, 14, 20]
    assert RAMP.to_dict(max_steps=10)["total_tokens"] == (8 + 7 * 6) * 16  # tokens over the plan's steps
    assert RAMP.to_dict(max_steps=10)["ramp_tokens"] == 8 * 16


def rank_batches(sampler, rank, world, count):
    sampler.set_shard(rank, world)
    out = []
    for b in sampler:
        out.append(b)
        if len(out) == count:
            break
    return out


def drain(samplers, micro_batches):
    """Every rank trains `micro_batches` micro batches each, in lockstep (what DataPosition counts)."""
    per_rank = [iter(s) for s in samplers]
    seen = []
    for _ in range(micro_batches):
        try:
            step = [next(it) for it in per_rank]
        except StopIteration:  # the pass ended: the next epoch, as Lightning asks for it
            per_rank = [iter(s) for s in samplers]
            step = [next(it) for it in per_rank]
        seen += step
        samplers[0].advance()
        for s in samplers[1:]:
            s.advance()
    return seen


def test_each_rank_draws_the_hand_computed_samples():
    sampler = RampBatchSampler(40, RAMP, seed=3)
    order = np.random.default_rng([3, 0]).permutation(40)
    rank0 = rank_batches(RampBatchSampler(40, RAMP, seed=3), 0, 2, 8)
    rank1 = rank_batches(RampBatchSampler(40, RAMP, seed=3), 1, 2, 8)
    expected0 = [order[0:1], order[2:3], order[4:6], order[8:11], order[14:17], order[20:23], order[26:29], order[32:35]]
    expected1 = [order[1:2], order[3:4], order[6:8], order[11:14], order[17:20], order[23:26], order[29:32], order[35:38]]
    assert rank0 == [e.tolist() for e in expected0]
    assert rank1 == [e.tolist() for e in expected1]
    sampler.set_shard(0, 2)
    assert len(sampler) == 8  # 8 whole steps fit in 40 samples (2 + 2 + 4 + 5 x 6 = 38)


@pytest.mark.parametrize("stop", [1, 2, 3, 5])
def test_resume_inside_the_ramp_continues_exactly(stop):
    def fresh(rank):
        s = RampBatchSampler(40, RAMP, seed=3)
        s.set_shard(rank, 2)
        return s

    unbroken = drain([fresh(0), fresh(1)], 14)  # into the second pass
    first = [fresh(0), fresh(1)]
    before = drain(first, stop)
    resumed = [fresh(0), fresh(1)]
    for r in resumed:
        r.load_state_dict(first[0].state_dict())
    assert before + drain(resumed, 14 - stop) == unbroken


def test_resume_on_another_data_parallel_size_continues_at_the_same_sample():
    """Saved on dp 2 (accumulation 1) inside the ramp, resumed on dp 1 with accumulation 2: the same
    global batches, micro batch for micro batch."""
    two = [RampBatchSampler(40, RAMP, seed=3) for _ in range(2)]
    for r, s in enumerate(two):
        s.set_shard(r, 2)
    unbroken = drain(two, 8)
    two = [RampBatchSampler(40, RAMP, seed=3) for _ in range(2)]
    for r, s in enumerate(two):
        s.set_shard(r, 2)
    head = drain(two, 2)  # two steps: inside the ramp
    one = RampBatchSampler(40, RAMP, seed=3)  # increment 2 = dp 1 x accumulation 2
    one.load_state_dict(two[0].state_dict())
    assert head + drain([one], 12) == unbroken


def test_the_schedule_is_counted_in_tokens():
    """Step k reads the schedule at the samples before it over the final batch."""
    s = Schedule(LrSchedule.cosine, 2, RAMP.equivalent_step(10), RAMP.equivalent_step(10) - 2, DecayShape.cosine, 0.1, RAMP)
    plain = Schedule(LrSchedule.cosine, 2, RAMP.equivalent_step(10), RAMP.equivalent_step(10) - 2, DecayShape.cosine, 0.1)
    assert s.multiplier(0) == pytest.approx(0.5)  # 0 tokens before it
    assert s.multiplier(2) == pytest.approx(plain.multiplier(4 / 6))  # 4 samples = 2/3 of a final step
    assert s.multiplier(3) == pytest.approx(1.0)  # 8/6 + 1 > warmup 2: at the peak, not above it
    assert s.multiplier(9) == pytest.approx(0.1)  # the last step ends the decay


def test_the_step_being_trained_is_every_rank_s_micro_batches_of_it():
    """train/callbacks/step_tokens.py weighs each step's loss by its trained tokens: the ramp's
    current_step is the step's micro batches (dp 2 x accumulation 2), each rank's dealt in turn,
    through the ramp and into the next pass."""
    ramp = BatchRamp(start=4, final=12, increment=4, samples=16, seq_len=16)
    samplers = [RampBatchSampler(50, ramp, seed=3) for _ in range(2)]
    for rank, s in enumerate(samplers):
        s.set_shard(rank, 2)
    passes = [iter(s) for s in samplers]
    steps, keys = 0, []  # step_key: the same through a step, another at the next (StepTokens reads a step once)
    while steps < 12:
        try:
            first = [next(p) for p in passes]
        except StopIteration:  # the pass ended: the next epoch, as Lightning asks for it
            passes = [iter(s) for s in samplers]
            first = [next(p) for p in passes]
        second = [next(p) for p in passes]
        dealt = [first[0], first[1], second[0], second[1]]  # micro batch j goes to rank j mod 2
        for micro in range(2):
            keys.append((steps, samplers[0].step_key()))
            for s in samplers:
                assert s.current_step() == dealt, (steps, micro)
            for s in samplers:
                s.advance()
        steps += 1
    assert samplers[0].epoch >= 1  # a later pass was reached
    assert all((a == b) == (k == j) for a, k in keys for b, j in keys)

"""The resumable batch sampler: epoch orders, sharding, length grouping, and a resumed Lightning run
that continues exactly where the checkpoint was taken (nothing repeated, nothing skipped)."""

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from tinytrain.data.sampler import ResumableBatchSampler
from tinytrain.train.callbacks.data_position import DataPosition


def flat(batches):
    return [i for b in batches for i in b]


def consume(sampler):
    """One pass as training sees it: every batch taken is trained on."""
    batches = []
    for b in sampler:
        batches.append(b)
        sampler.advance()
    return batches


def test_each_epoch_is_a_seeded_permutation():
    s = ResumableBatchSampler(23, 4, seed=7)
    epoch0 = consume(s)
    assert len(epoch0) == len(s) == 5 and all(len(b) == 4 for b in epoch0)  # 23 // 4, last partial dropped
    assert len(set(flat(epoch0))) == 20
    assert list(ResumableBatchSampler(23, 4, seed=7)) == epoch0
    assert list(ResumableBatchSampler(23, 4, seed=8)) != epoch0
    assert list(s) == list(s)  # a pass that is not consumed does not move the position
    epoch1 = consume(s)
    assert s.epoch == 1 and epoch1 != epoch0 and epoch1 == ResumableBatchSampler(23, 4, seed=7).global_batches(1)


def test_an_epoch_ends_on_a_whole_optimizer_step_whose_batches_are_known():
    """Under accumulation a pass is whole steps of world x accumulation micro batches: a step run
    into the next epoch would be counted on by DeepSpeed's engine and anew by Lightning. Each step's
    micro batches (every rank's) are known while it trains (train/callbacks/step_tokens.py)."""
    ranks = [ResumableBatchSampler(23, 2, seed=5) for _ in range(2)]  # 11 global batches of 2
    for rank, s in enumerate(ranks):
        s.set_shard(rank, 2)
        s.accumulation = 2
    assert ranks[0].num_batches() == 8 and len(ranks[0]) == 4  # two whole steps of 4; 3 batches left out
    passes = [iter(s) for s in ranks]
    full = ranks[0].global_batches(0)
    keys = []  # step_key: the same through a step, another at the next (StepTokens reads a step once)
    for step in range(2):
        for _ in range(2):  # each rank's two micro batches of the step
            mine = [next(p) for p in passes]
            keys.append((step, ranks[0].step_key()))
            for s in ranks:
                assert s.current_step() == full[4 * step : 4 * step + 4] and all(b in s.current_step() for b in mine)
                s.advance()
    assert all(next(p, None) is None for p in passes)
    assert len({key for _, key in keys}) == 2 and all((a == b) == (k == j) for a, k in keys for b, j in keys)


def test_resume_continues_after_the_consumed_batches_despite_read_ahead():
    s = ResumableBatchSampler(40, 4, seed=1)
    full = list(s)
    loader = DataLoader(range(40), batch_sampler=s, num_workers=2, prefetch_factor=4)
    seen = []
    for batch in loader:  # workers read ahead of what training consumed
        seen.append(batch.tolist())
        s.advance()
        if len(seen) == 3:
            state = s.state_dict()
            break
    resumed = ResumableBatchSampler(40, 4, seed=1)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert seen + rest == full
    assert len(resumed) == len(full)  # the epoch's length, as Lightning counts resumed batches itself


def test_ranks_get_disjoint_equal_shards_and_resume_on_another_world_size():
    full = ResumableBatchSampler(50, 4, seed=3).global_batches(0)
    shards = []
    for rank in range(3):
        s = ResumableBatchSampler(50, 4, seed=3)
        s.set_shard(rank, 3)
        shards.append(list(s))
    assert [len(x) for x in shards] == [4, 4, 4]  # 12 batches of 4 fit, trimmed to a multiple of 3
    assert sorted(flat(flat(shards))) == sorted(flat(full[:12]))
    two = ResumableBatchSampler(50, 4, seed=3)
    two.set_shard(0, 2)
    two.advance()
    two.advance()  # two steps on 2 ranks: 4 global batches
    one = ResumableBatchSampler(50, 4, seed=3)
    one.load_state_dict(two.state_dict())
    assert list(one)[0] == full[4]


def test_a_position_that_is_not_a_multiple_of_the_new_world_size_neither_repeats_nor_skips():
    """2 batches trained on 1 rank, resumed on 4 (and 3 on 3 ranks, resumed on 2): each rank starts
    at the first batch not trained on (4 ranks started at batch 0: a repeat), and every rank gets
    as many batches. 50 samples in 12 batches of 4."""

    def resumed(consumed, world):
        state = {"epoch": 0, "consumed_batches": consumed, "num_samples": 50, "batch_size": 4, "seed": 3}
        ranks = [ResumableBatchSampler(50, 4, seed=3) for _ in range(world)]
        for rank, s in enumerate(ranks):
            s.set_shard(rank, world)
            s.load_state_dict(state)
        return ranks

    full = ResumableBatchSampler(50, 4, seed=3).global_batches(0)
    for consumed, world in ((2, 4), (3, 2)):
        ranks = resumed(consumed, world)
        passes = [list(s) for s in ranks]
        dealt = (12 - consumed) // world
        assert [len(p) for p in passes] == [dealt] * world
        assert [p[0] for p in passes] == full[consumed : consumed + world]
        assert sorted(flat(flat(passes))) == sorted(flat(full[consumed : consumed + dealt * world]))
        for s in ranks:  # the epoch's rest trained on: the next pass is the next epoch's
            for _ in range(dealt):
                s.advance()
            assert list(s)[0] == s.global_batches(1)[s.rank] and s.epoch == 1
    # 11 of 12 trained: the last batch cannot go to both ranks, so (as in an aligned epoch's
    # trimmed rest) the next epoch starts.
    assert [list(s)[0] for s in resumed(11, 2)] == ResumableBatchSampler(50, 4, seed=3).global_batches(1)[:2]


def test_a_position_saved_in_batches_of_another_size_continues_at_the_same_sample(caplog):
    """A resumed run with another micro batch (the epoch's order is the same permutation) continues
    at the first sample not trained on: it restarted the epoch, training what it had trained again.
    12 samples of 4 trained, resumed in batches of 2 (and of 8: the batch holding sample 12 starts
    at 8, so samples 8-11 come again, and the log says so)."""
    order = ResumableBatchSampler(40, 1, seed=1).global_batches(0)
    saved = {"epoch": 0, "consumed_batches": 3, "num_samples": 40, "batch_size": 4, "seed": 1}
    halves = ResumableBatchSampler(40, 2, seed=1)
    halves.load_state_dict(saved)
    assert flat(consume(halves)) == flat(order[12:])
    caplog.set_level("INFO")
    eights = ResumableBatchSampler(40, 8, seed=1)
    eights.load_state_dict(saved)
    assert flat(list(eights)) == flat(order[8:40])
    assert "continuing at batch 1 in batches of 8 (the 4 sample(s) before sample 12 in that batch are trained again)" in caplog.text
    grouped = ResumableBatchSampler(40, 2, seed=1, lengths=list(range(40)))  # its batches depend on their size
    grouped.load_state_dict(saved)
    assert grouped.consumed == 0 and "length grouping orders batches by their size" in caplog.text


def test_length_grouping_cuts_padding_and_puts_the_longest_first():
    rng = np.random.default_rng(0)
    lengths = rng.integers(5, 500, size=1000).tolist()
    grouped = list(ResumableBatchSampler(1000, 8, seed=0, lengths=lengths))
    plain = list(ResumableBatchSampler(1000, 8, seed=0))
    assert sorted(flat(grouped)) == list(range(1000))  # every sample once (1000 = 125 full batches)
    padded = lambda batches: sum(len(b) * max(lengths[i] for i in b) for b in batches)  # noqa: E731
    assert padded(grouped) < 0.7 * padded(plain)
    assert max(lengths[i] for i in grouped[0]) == max(lengths)


def test_a_position_at_the_end_of_an_epoch_continues_with_the_next():
    s = ResumableBatchSampler(40, 4, seed=1)
    s.load_state_dict({"epoch": 2, "consumed_batches": 3, "num_samples": 40, "batch_size": 4, "seed": 1})
    assert len(consume(s)) == 7 and s.epoch == 2
    s.load_state_dict({"epoch": 2, "consumed_batches": 10, "num_samples": 40, "batch_size": 4, "seed": 1})
    assert list(s) == s.global_batches(3) and s.epoch == 3


def test_position_for_other_data_restarts_the_epoch(caplog):
    s = ResumableBatchSampler(40, 4, seed=1)
    s.load_state_dict({"epoch": 1, "consumed_batches": 3, "num_samples": 99, "batch_size": 4, "seed": 1})
    assert s.epoch == 1 and len(list(s)) == 10
    assert "starting epoch 1 from its first batch" in caplog.text


class Indices(Dataset):
    def __len__(self):
        return 10

    def __getitem__(self, i):
        return torch.tensor([float(i)])


class Recorder(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append(batch.flatten().int().tolist())
        return (self.w * batch).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def run(tmp_path, max_steps, ckpt_path=None, every=None):
    sampler = ResumableBatchSampler(10, 2, seed=5)  # 5 batches per epoch
    module = Recorder()
    callbacks = [DataPosition(sampler)]
    if every:
        callbacks.append(pl.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=every, save_top_k=-1, filename="{step}"))
    trainer = pl.Trainer(
        accelerator="cpu", max_steps=max_steps, callbacks=callbacks, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=bool(every), use_distributed_sampler=False, default_root_dir=tmp_path,
    )
    loader = DataLoader(Indices(), batch_sampler=sampler, num_workers=0)
    trainer.fit(module, loader, ckpt_path=ckpt_path)
    return module.seen


def test_a_resumed_lightning_run_neither_repeats_nor_skips(tmp_path):
    uninterrupted = run(tmp_path / "a", max_steps=12)
    assert len(uninterrupted) == 12  # crosses two epoch boundaries
    run(tmp_path / "b", max_steps=12, every=1)
    for step in (3, 5, 9, 10):  # mid-epoch, and at the end of an epoch (5 batches per epoch)
        resumed = run(tmp_path / f"c{step}", max_steps=12, ckpt_path=tmp_path / "b" / f"step={step}.ckpt")
        assert resumed == uninterrupted[step:], step

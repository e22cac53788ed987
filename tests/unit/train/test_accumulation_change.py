"""A run resumed under another gradient accumulation re-counts Lightning's micro batches in it
(train/callbacks/accumulation_change.py): the run's total and this epoch's count, each in its own
steps. One shift for both, taken from this epoch's count, was right in the first epoch only: a
checkpoint of step 5 (3 steps in epoch 0, 2 in epoch 1) resumed from accumulation 3 under 6 labelled
every later metrics row a step low and moved validation."""

from tinytrain.train.callbacks.accumulation_change import KEY, AccumulationChange


def checkpoint(total: int, current: int, accumulation: int) -> dict:
    counters = lambda n: dict.fromkeys(("ready", "started", "processed", "completed"), n)  # noqa: E731
    return {
        "callbacks": {"AccumulationChange": {KEY: accumulation}},
        "loops": {"fit_loop": {"epoch_loop.batch_progress": {"total": counters(total), "current": counters(current)}}},
    }


def test_the_run_s_and_the_epoch_s_micro_batches_are_each_re_counted_in_their_steps():
    saved = checkpoint(total=5 * 3, current=2 * 3, accumulation=3)
    callback = AccumulationChange(6)
    callback.on_load_checkpoint(None, None, saved)
    progress = saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert progress["total"] == dict.fromkeys(("ready", "started", "processed", "completed"), 5 * 6)
    assert progress["current"] == dict.fromkeys(("ready", "started", "processed", "completed"), 2 * 6)


def test_the_same_accumulation_changes_nothing():
    saved = checkpoint(total=15, current=6, accumulation=3)
    AccumulationChange(3).on_load_checkpoint(None, None, saved)
    assert saved["loops"]["fit_loop"]["epoch_loop.batch_progress"]["total"]["ready"] == 15

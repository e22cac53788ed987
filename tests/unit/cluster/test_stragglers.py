"""Straggler decisions (tinytrain/cluster/stragglers.py); the 2-rank runs with a rank slowed by
50% and by 5% are in tests/integration/test_watchdog.py."""

import statistics

import pytest

from tinytrain.cluster.stragglers import StragglerRecord, slowdowns, typical_forward


def test_each_rank_is_compared_with_the_median_of_the_others():
    # With two ranks the median of all would show a 50% slower rank as 20% slower.
    assert slowdowns([1.0, 1.5]) == pytest.approx([-1 / 3, 0.5])
    assert slowdowns([1.0, 1.0, 1.1, 2.0]) == pytest.approx([-0.0909, -0.0909, 0.1, 1.0], abs=1e-3)
    assert slowdowns([3.0]) == [0.0]


def test_a_rank_is_named_only_when_slower_in_consecutive_checks():
    record = StragglerRecord(threshold=0.2)
    assert record.check([1.0, 1.5, 1.0, 1.0]) == []  # once is a hiccup
    assert record.check([1.0, 1.0, 1.0, 1.0]) == []
    assert record.check([1.0, 1.5, 1.0, 1.0]) == []
    assert record.check([1.0, 1.6, 1.0, 1.0]) == [(1, pytest.approx(0.6))]
    assert record.summary().startswith("stragglers: rank 1 60% slower than the others' median (named in 1 of 4 checks)")


def test_a_rank_5_percent_slower_is_not_named_and_the_summary_says_the_slowest():
    record = StragglerRecord(threshold=0.2)
    for _ in range(5):
        assert record.check([1.0, 1.05]) == []
    assert record.summary() == "stragglers: none above 20% in 5 checks; the slowest, rank 1, was 5% slower than the others' median"
    assert StragglerRecord(0.2).summary().startswith("stragglers: not checked")


def test_a_window_is_typified_by_its_lower_quartile_so_added_noise_does_not_count():
    # a rank's forwards (ms) on a loaded machine, half of them with page faults (~2 ms of system time)
    faulted = [7.2, 9.3, 7.1, 8.8, 6.8, 8.7, 9.0, 8.4]
    clean = [6.9, 7.0, 6.7, 6.8, 7.0, 6.6, 6.9, 6.8]
    assert statistics.median(faulted) / statistics.median(clean) > 1.2  # named by the median
    assert typical_forward(faulted) / typical_forward(clean) < 1.1
    # a rank slow in every forward stays slow by the quartile
    assert typical_forward([1.5 * t for t in clean]) / typical_forward(clean) == pytest.approx(1.5)
    assert typical_forward([3.0, 2.0]) == 2.0 and typical_forward([5.0]) == 5.0

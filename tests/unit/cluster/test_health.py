"""The health check's judgement and actions (tinytrain/cluster/health.py) and its plan
(tinytrain/plan/health.py); measured for real on one CPU process; the 2-rank runs (a healthy world,
a rank slowed by the test hook) are in tests/integration/test_watchdog.py."""

import pytest
import torch

from tests.conftest import compose
from tinytrain.cluster import health
from tinytrain.errors import TrainingStopped
from tinytrain.plan.health import health_plan


def rank(r, tflops, host="node1", memory_ok=True):
    return {"rank": r, "host": host, "tflops": tflops, "memory_ok": memory_ok, "memory": "ok" if memory_ok else "could not allocate 70.0 of 75.0 GiB free"}


def test_a_slow_rank_is_named_against_the_others_median_and_a_gpu_against_the_table_peak():
    ranks = [rank(0, 700.0), rank(1, 690.0, "node2"), rank(2, 400.0, "node2"), rank(3, 710.0)]
    verdict = health.judge(ranks, 150.0, device_type="cuda", peak_tflops=989.0)
    assert [(r, h) for r, h, _ in verdict["bad"]] == [(2, "node2")]
    assert "57% of the other ranks' median 700" in verdict["bad"][0][2]
    all_slow = health.judge([rank(0, 300.0), rank(1, 310.0)], 150.0, device_type="cuda", peak_tflops=989.0)
    assert [r for r, _, _ in all_slow["bad"]] == [0, 1]  # below 40% of the peak, though alike
    assert "at least 396 TFLOP/s (40% of the 989 TFLOP/s dense peak in the hardware table)" in all_slow["thresholds"][0]


def test_memory_and_the_all_reduce_are_judged_and_everything_is_rendered():
    verdict = health.judge([rank(0, 1.0), rank(1, 1.0, memory_ok=False)], 0.001, device_type="cpu", peak_tflops=None)
    assert [r for r, _, _ in verdict["bad"]] == [1, -1]
    text = health.render(verdict)
    assert "BAD: rank 1 on node1: memory: could not allocate" in text and "all-reduce bus bandwidth 0.001 GB/s, below 0.01 GB/s" in text
    assert "health     bad node(s): node1" in text
    assert "health     ok" in health.render(health.judge([rank(0, 1.0), rank(1, 0.9)], 1.0, device_type="cpu", peak_tflops=None))


def test_a_bad_node_stops_the_run_naming_it_or_is_warned_about():
    verdict = health.judge([rank(0, 1.0), rank(1, 0.4, "node7"), rank(2, 1.0)], None, device_type="cpu", peak_tflops=None)
    with pytest.raises(TrainingStopped, match=r"rank 1 on node7: matmul .* Fix: resubmit with sbatch --exclude=node7"):
        health.act(verdict, "stop", job=None)
    assert "cluster.on_bad_node=warn: training anyway" in health.act(verdict, "warn", job=None)
    assert health.act(health.judge([rank(0, 1.0)], None, device_type="cpu", peak_tflops=None), "stop", job=None) == "ok"


def test_one_cpu_process_measures_itself_and_passes():
    verdict = health.check_world(torch.device("cpu"), torch.float32, budget_s=0.4, peak_tflops=None)
    assert verdict["bad"] == [] and verdict["ranks"][0]["tflops"] > 0 and verdict["busbw"] is None


def test_auto_runs_the_check_for_gpu_runs_of_several_ranks_only():
    cluster = compose([]).cluster
    assert health_plan(cluster, 8, on_gpu=True).enabled
    assert not health_plan(cluster, 1, on_gpu=True).enabled and not health_plan(cluster, 8, on_gpu=False).enabled
    forced = health_plan(compose(["cluster.health_check=true", "cluster.on_bad_node=warn"]).cluster, 2, on_gpu=False)
    assert forced.enabled and forced.reason.endswith("a bad node -> warn")

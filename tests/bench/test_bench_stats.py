"""Latency statistics, the timing loop's run counting and the per-op profile aggregation
(no timing assertions)."""

from __future__ import annotations

import statistics

import pytest

from tconform.bench.profile import MATRIX_OPS, outside_matmul_share
from tconform.bench.timing import latency_stats, peak_rss_mb, timed_runs

pytestmark = pytest.mark.unit


def test_percentiles_mean_and_std_of_a_known_series():
    seconds = [ms / 1e3 for ms in range(1, 101)]  # 1 ms .. 100 ms
    stats = latency_stats(seconds)
    # Linear interpolation between order statistics: rank (n - 1) * q.
    assert stats.p50_ms == pytest.approx(50.5)
    assert stats.p90_ms == pytest.approx(90.1)
    assert stats.p99_ms == pytest.approx(99.01)
    assert stats.mean_ms == pytest.approx(50.5)
    assert stats.std_ms == pytest.approx(statistics.stdev(range(1, 101)))
    assert stats.runs == 100


def test_single_run_has_zero_spread_and_empty_input_is_refused():
    assert latency_stats([0.004]).std_ms == 0.0
    with pytest.raises(ValueError):
        latency_stats([])


def test_timed_runs_does_warmup_then_exactly_runs_calls():
    calls = []
    times = timed_runs(lambda: calls.append(1), warmup=3, runs=7)
    assert len(times) == 7
    assert len(calls) == 10


def test_time_budget_still_gives_the_minimum_run_count():
    times = timed_runs(lambda: None, warmup=0, runs=None, seconds=1e-9, min_runs=4)
    assert len(times) == 4


def test_peak_rss_is_a_positive_size():
    assert peak_rss_mb() > 1.0


def test_share_outside_matrix_products_counts_every_other_op():
    profile = {
        "MatMul": {"share": 0.6},
        "Attention": {"share": 0.1},
        "Softmax": {"share": 0.2},
        "Transpose": {"share": 0.1},
    }
    assert "Attention" in MATRIX_OPS and "Softmax" not in MATRIX_OPS
    assert outside_matmul_share(profile) == pytest.approx(0.3)


def test_the_int8_graphs_fused_integer_products_are_matrix_products():
    profile = {
        "DynamicQuantizeMatMul": {"share": 0.7},
        "MatMulIntegerToFloat": {"share": 0.2},
        "DynamicQuantizeLinear": {"share": 0.04},
        "Softmax": {"share": 0.06},
    }
    assert outside_matmul_share(profile) == pytest.approx(0.1)

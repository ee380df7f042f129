"""The timing loop, latency statistics and per-engine peak memory (the loop and the peak
live with the runtimes, tconform.runtimes.timing, since a worker process times its own runs)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tconform.runtimes.timing import MAX_RUNS, peak_rss_mb, reset_peak_rss, timed_runs

__all__ = [
    "MAX_RUNS",
    "LatencyStats",
    "current_rss_mb",
    "latency_stats",
    "peak_rss_mb",
    "reset_peak_rss",
    "round_sig",
    "timed_runs",
]


@dataclass(frozen=True)
class LatencyStats:
    """Latency statistics in milliseconds."""

    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    std_ms: float
    runs: int


def latency_stats(seconds: list[float]) -> LatencyStats:
    """Percentiles by linear interpolation (numpy's default); std with Bessel's correction."""
    if not seconds:
        raise ValueError("no timed runs")
    ms = np.asarray(seconds, dtype=np.float64) * 1e3
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    std = float(ms.std(ddof=1)) if len(ms) > 1 else 0.0
    return LatencyStats(float(p50), float(p90), float(p99), float(ms.mean()), std, len(ms))


def current_rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def round_sig(value: float, digits: int = 4) -> float:
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))

"""The timing loop, latency statistics and per-engine peak memory."""

from __future__ import annotations

import math
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MAX_RUNS = 10_000


def timed_runs(
    run: Callable[[], object],
    warmup: int,
    runs: int | None = None,
    seconds: float | None = None,
    min_runs: int = 3,
) -> list[float]:
    """Seconds per call of `run`: `warmup` untimed calls, then `runs` timed calls, or as many
    as fit in `seconds` (at least `min_runs`)."""
    for _ in range(warmup):
        run()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < MAX_RUNS:
        if runs is not None and len(times) >= runs:
            break
        if runs is None:
            elapsed = time.perf_counter() - started
            if len(times) >= min_runs and elapsed >= (seconds or 0.0):
                break
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return times


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


# --- peak memory -------------------------------------------------------------------------------
# Linux keeps the process's RSS high-water mark (VmHWM) and resets it when "5" is written to
# /proc/self/clear_refs, so each engine's peak can be measured on its own: reset before the
# engine opens its session, read after its last run. Elsewhere only the lifetime peak
# (getrusage) exists, which an earlier engine may have set; the report says which was used.

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def reset_peak_rss() -> bool:
    """Reset the RSS high-water mark; False if this system cannot."""
    try:
        _CLEAR_REFS.write_text("5")
        return True
    except OSError:
        return False


def peak_rss_mb() -> float:
    """The process's RSS high-water mark in MiB (since the last reset, where supported)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # reported in kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def current_rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def round_sig(value: float, digits: int = 4) -> float:
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))

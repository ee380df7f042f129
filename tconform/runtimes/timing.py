"""The timing loop and a process's peak memory: here, beside the runtimes, because a runtime in a
worker process (tconform.runtimes.remote) times its own runs, with no pipe inside the loop, and
reports its own peak; bench (tconform.bench.timing) uses the same."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from pathlib import Path

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


def rss_mb() -> float | None:
    """The process's resident memory now, in MiB (None where /proc does not say)."""
    try:
        for line in _STATUS.read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None

"""One measurement: open an engine, time it, and turn the times into one report row (latency
percentiles, throughput, achieved FLOP/s against the ceiling, memory, the memory floor from the
engine's own weight bytes, and its outputs judged against the workload's float64 outputs:
the oracle's for tconform's cases, the float64 copy's for a user's model)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from functools import partial

from tconform.bench.accuracy import judge_outputs
from tconform.bench.ceiling import memory_floor_ms, share_of_ceiling
from tconform.bench.timing import (
    current_rss_mb,
    latency_stats,
    peak_rss_mb,
    reset_peak_rss,
    round_sig,
    timed_runs,
)
from tconform.bench.workload import Workload
from tconform.errors import WorkerCrashed
from tconform.results import Status
from tconform.runtimes import TimedCall


def measure(
    workload: Workload,
    engine: str,
    ep: str,
    opener: Callable[[], TimedCall],
    ceiling: dict,
    timing: dict,
) -> dict:
    """The row of `engine` on `ep` on `workload`: `pass` with its figures, `crash` where its
    worker process died (the reason names how, and its repro bundle), or `skip` with the
    reason it could not run (torch.compile without a compiler, a reduced precision this CPU
    lacks, ...). `timing` holds warmup, runs and seconds; `ceiling` is the provider's measured
    ceiling. One more run's outputs, where the engine gives them, are judged against the
    workload's float64 outputs (`accuracy`)."""
    row = {"case": workload.case, "engine": engine, "ep": ep, **workload.shape_fields()}
    gc.collect()
    rss_before = current_rss_mb()
    peak_is_own = reset_peak_rss()
    opened = None
    try:
        opened = opener()
        loop = opened.times or partial(timed_runs, opened.run)  # a worker times its own runs
        times = loop(timing["warmup"], timing["runs"], timing["seconds"])
    except WorkerCrashed as exc:  # the engine's process died: a verdict, the run goes on
        reason = opened.crashed(exc) if opened is not None else str(exc)
        # what it ran: the opened call's details, else what the engine knew before opening
        details = opened.details if opened is not None else getattr(exc, "details", None)
        return {
            **row, "status": Status.CRASH.value, "reason": reason,
            **({"details": details} if details else {}),
        }  # fmt: skip
    except Exception as exc:  # torch.compile, torch without CUDA, ...: say why, keep timing
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        details = getattr(exc, "details", None)  # the model and the release that said so
        status = getattr(exc, "status", Status.SKIP)  # error: a runtime rejected a sound model
        return {
            **row, "status": Status(status).value, "reason": reason,
            **({"details": details} if details else {}),
        }  # fmt: skip
    stats = latency_stats(times)
    flop = workload.flop
    gflops = flop / (stats.p50_ms / 1e3) / 1e9 if flop is not None else None
    # What it computed in: its tolerance row, and the ceiling its share is of.
    precision = getattr(opened, "precision", "float32")
    share, note = share_of_ceiling(gflops, precision, ceiling) if flop else (None, "")
    tokens = workload.tokens
    row.update(
        status=Status.PASS.value,
        precision=precision,
        p50_ms=round_sig(stats.p50_ms),
        p90_ms=round_sig(stats.p90_ms),
        p99_ms=round_sig(stats.p99_ms),
        mean_ms=round_sig(stats.mean_ms),
        std_ms=round_sig(stats.std_ms),
        runs=stats.runs,
        tokens_per_s=round_sig(tokens / (stats.p50_ms / 1e3)) if tokens else None,
        gflop=round_sig(flop / 1e9) if flop is not None else None,
        gflops=round_sig(gflops) if gflops is not None else None,
        peak_fraction=share,
        **(
            opened.memory()  # the worker's own peak, where the engine ran in one
            if opened.memory
            else {
                "peak_mem_mb": round(peak_rss_mb(), 1),
                "peak_mem_delta_mb": round(peak_rss_mb() - rss_before, 1),
                "peak_mem_method": "VmHWM reset per engine"
                if peak_is_own
                else "process lifetime maxrss",
            }
        ),
        device_mem_mb=opened.device_memory_mb(),
        details=opened.details,
    )
    if note:
        row["peak_fraction_note"] = note
    if ep == "cpu" and workload.batch == 1 and "copy_bandwidth_gbs" in ceiling:
        weights = _weight_bytes(opened, workload)
        if weights:
            row.update(weights)
            row["memory_floor_ms"] = memory_floor_ms(row["weight_bytes"], ceiling)
    outputs = getattr(opened, "outputs", None)
    if outputs is not None:
        row["accuracy"] = judge_outputs(
            outputs(), workload.expected(), precision, workload.tolerance, workload.preset,
            workload.judge,
        )  # fmt: skip
    opened.close()
    del opened
    return row


def _weight_bytes(opened: TimedCall, workload: Workload) -> dict:
    """The weight bytes one forward pass of the engine reads, counted from what it holds (its
    ONNX file's initializers, its module's tensors); from the config's float32 parameters
    where it says nothing of its own ({} where neither says)."""
    count = getattr(opened, "weight_bytes", None)
    if count is not None:
        # Tokens bound how many rows a gathered table gives; without a sequence axis, one per
        # sample: fewer bytes, so the floor stays a lower bound.
        tokens = workload.tokens or workload.batch or 1
        return {"weight_bytes": count(tokens), "weight_bytes_from": "engine"}
    if workload.config_weight_bytes is None:
        return {}
    return {
        "weight_bytes": workload.config_weight_bytes(),
        "weight_bytes_from": "config (float32 parameters)",
    }

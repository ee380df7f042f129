"""One measurement: open an engine, time it, and turn the times into one report row (latency
percentiles, throughput, achieved FLOP/s against the ceiling, memory, the memory floor from the
engine's own weight bytes, and its outputs judged against the float64 oracle)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping
from functools import partial

import numpy as np

from tconform.bench.accuracy import judge_outputs
from tconform.bench.ceiling import memory_floor_ms
from tconform.bench.timing import (
    current_rss_mb,
    latency_stats,
    peak_rss_mb,
    reset_peak_rss,
    round_sig,
    timed_runs,
)
from tconform.config import ModelConfig
from tconform.errors import WorkerCrashed
from tconform.registry import Case, Shape
from tconform.results import Status
from tconform.runtimes import TimedCall


def measure(
    case: Case,
    cfg: ModelConfig,
    batch: int,
    seq: int,
    engine: str,
    ep: str,
    opener: Callable[[], TimedCall],
    ceiling: dict,
    timing: dict,
    golden: Callable[[], Mapping[str, np.ndarray]] | None = None,
    preset: str | None = None,
) -> dict:
    """The row of `engine` on `ep` at batch x seq: `pass` with its figures, `crash` where its
    worker process died (the reason names how, and its repro bundle), or `skip` with the
    reason it could not run (torch.compile without a compiler, a reduced precision this CPU
    lacks, ...). `timing` holds warmup, runs and seconds; `ceiling` is the provider's measured
    ceiling; `golden` gives the float64 oracle's outputs by name, against which one more run's
    outputs are judged (`accuracy`), where the engine gives its outputs."""
    row: dict[str, object] = {
        "case": case.name,
        "engine": engine,
        "ep": ep,
        "batch": batch,
        "seq": seq,
    }
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
        return {**row, "status": Status.CRASH.value, "reason": reason}
    except Exception as exc:  # torch.compile, torch without CUDA, ...: say why, keep timing
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        return {**row, "status": Status.SKIP.value, "reason": reason}
    stats = latency_stats(times)
    flop = case.flop_count(cfg, Shape(batch, seq, seq))
    gflops = flop / (stats.p50_ms / 1e3) / 1e9
    row.update(
        status=Status.PASS.value,
        p50_ms=round_sig(stats.p50_ms),
        p90_ms=round_sig(stats.p90_ms),
        p99_ms=round_sig(stats.p99_ms),
        mean_ms=round_sig(stats.mean_ms),
        std_ms=round_sig(stats.std_ms),
        runs=stats.runs,
        tokens_per_s=round_sig(batch * seq / (stats.p50_ms / 1e3)),
        gflop=round_sig(flop / 1e9),
        gflops=round_sig(gflops),
        peak_fraction=round(gflops / ceiling["gemm_gflops"], 3) if flop else None,
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
    if ep == "cpu" and batch == 1 and "copy_bandwidth_gbs" in ceiling:
        row.update(_weight_bytes(opened, case, cfg, batch, seq))
        row["memory_floor_ms"] = memory_floor_ms(row["weight_bytes"], ceiling)
    outputs = getattr(opened, "outputs", None)
    if golden is not None and outputs is not None:
        precision = getattr(opened, "precision", "float32")
        row["accuracy"] = judge_outputs(outputs(), golden(), precision, case.tolerance, preset)
    opened.close()
    del opened
    return row


def _weight_bytes(opened: TimedCall, case: Case, cfg: ModelConfig, batch: int, seq: int) -> dict:
    """The weight bytes one forward pass of the engine reads, counted from what it holds (its
    ONNX file's initializers, its module's tensors); from the config's float32 parameters
    where it says nothing of its own."""
    count = getattr(opened, "weight_bytes", None)
    if count is not None:
        return {"weight_bytes": count(batch * seq), "weight_bytes_from": "engine"}
    return {
        "weight_bytes": case.weight_bytes_read(cfg, Shape(batch, seq, seq)),
        "weight_bytes_from": "config (float32 parameters)",
    }

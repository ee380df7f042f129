"""One bench run: export (cached), measure the ceiling per provider, then time every engine on
every case and shape with the same inputs, one row per measurement."""

from __future__ import annotations

import gc
import os
import tempfile
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from tconform import registry
from tconform.bench.ceiling import measure_ceiling
from tconform.bench.engines import OpenedEngine, open_ort, open_torch, parse_engines
from tconform.bench.fusions import fused_model, fused_op_counts
from tconform.bench.timing import (
    current_rss_mb,
    latency_stats,
    peak_rss_mb,
    reset_peak_rss,
    round_sig,
    timed_runs,
)
from tconform.config import ModelConfig, get_preset
from tconform.errors import ProviderUnavailable, UsageError
from tconform.export import ExportSettings, build_module, export_cases
from tconform.registry import Case, Shape
from tconform.report.environment import environment, utc_now
from tconform.runtimes.onnxruntime import OrtRuntime
from tconform.runtimes.providers import parse_eps, unavailable_reason
from tconform.runtimes.torch import TorchRuntime

DEFAULT_CASES = ("transformer", "encoder_layer", "decoder_layer", "feed_forward", "mha_self")
DEFAULT_SHAPES = ((1, 32), (8, 128))
SCHEMA = "tconform-bench/2"  # /2: status pass/skip (was ok/skipped), environment block


def default_threads() -> int:
    """One intra-op thread per physical core (hyper-threads share the FMA units)."""
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


# A run holds the inputs and outputs several times over (numpy, ONNX Runtime's buffers, torch).
MEMORY_FACTOR = 4


def check_shape(shape: tuple[int, int], cases: tuple[Case, ...], cfg: ModelConfig) -> None:
    """A shape must fit the preset's sequence length and this machine's memory."""
    import psutil

    batch, seq = shape
    if seq > cfg.max_seq_len:
        raise UsageError(
            f"--shape {batch}x{seq}: sequence {seq} exceeds the preset's {cfg.max_seq_len}"
        )
    available = psutil.virtual_memory().available
    for case in cases:
        need = MEMORY_FACTOR * registry.io_bytes(case, cfg, Shape(batch, seq, seq))
        if need > available:
            raise UsageError(
                f"--shape {batch}x{seq}: {case.name} needs about {need / 2**30:.1f} GiB for its "
                f"inputs and outputs; {available / 2**30:.1f} GiB are available here"
            )


def bench_settings(
    preset, cases, shapes, engines, ep_spec, threads, graph_opt, warmup, runs, seconds,
    artifacts, profile=False,
) -> BenchSettings:  # fmt: skip
    """Validate every option before anything slow starts."""
    cfg = get_preset(preset)
    selected = registry.select_cases(cases or DEFAULT_CASES)
    for shape in shapes:
        check_shape(shape, selected, cfg)
    return BenchSettings(
        preset=preset,
        cfg=cfg,
        cases=selected,
        shapes=tuple(shapes) or DEFAULT_SHAPES,
        engines=parse_engines(engines),
        eps=tuple(parse_eps(ep_spec)),
        threads=threads or default_threads(),
        graph_opt=graph_opt,
        warmup=warmup,
        runs=runs,
        seconds=seconds,
        artifacts=artifacts or Path("artifacts") / "bench" / preset,
        profile=profile,
    )


@dataclass(frozen=True)
class BenchSettings:
    preset: str
    cfg: ModelConfig
    cases: tuple[Case, ...]
    shapes: tuple[tuple[int, int], ...]
    engines: tuple[str, ...]
    eps: tuple[str, ...]
    threads: int
    graph_opt: str
    warmup: int
    runs: int | None
    seconds: float
    artifacts: Path
    profile: bool = False

    def record(self) -> dict[str, object]:
        return {
            "preset": self.preset,
            "cases": [c.name for c in self.cases],
            "shapes": [f"{b}x{s}" for b, s in self.shapes],
            "engines": list(self.engines),
            "eps": list(self.eps),
            "intra_op_threads": self.threads,
            "torch_threads": self.threads,
            "graph_optimization": self.graph_opt,
            "warmup": self.warmup,
            "runs": self.runs,
            "seconds": self.seconds,
        }


Log = Callable[[str], None]


def run_bench(settings: BenchSettings, log: Log) -> dict:
    """The whole report: environment, ceilings, unavailable providers, one row per timing."""
    started = utc_now()
    torch.set_num_threads(settings.threads)
    paths = _export(settings, log)
    ceilings: dict[str, dict] = {}
    unavailable: list[dict[str, str]] = []
    for ep in settings.eps:
        reason = unavailable_reason(ep)
        if reason is None:
            try:
                log(f"measuring the {ep} GEMM ceiling and memory bandwidth ...")
                ceilings[ep] = measure_ceiling(_ort_runtime(settings, ep))
                continue
            except ProviderUnavailable as exc:
                reason = str(exc)
        log(f"provider {ep} unavailable, not timed: {reason}")
        unavailable.append({"ep": ep, "reason": reason})
    rows: list[dict] = []
    # The engines depend on the settings and the providers that run, not on the case.
    per_shape = sum(1 for _ in _engines(settings, settings.cases[0], {}, {}, paths, ceilings))
    total = per_shape * len(settings.cases) * len(settings.shapes)
    for case in settings.cases:
        _, params = build_module(case, ExportSettings(settings.cfg))
        for batch, seq in settings.shapes:
            feeds = registry.make_inputs(
                case, settings.cfg, Shape(batch, seq, seq), np.random.default_rng(0)
            )
            for label, ep, opener in _engines(settings, case, params, feeds, paths, ceilings):
                what = f"{case.name} {label}/{ep} {batch}x{seq}"
                log(f"{progress_bar(len(rows), total)} timing {what} ...")
                row = _measure(settings, case, batch, seq, label, ep, opener, ceilings, log)
                if settings.profile and label == "onnxruntime" and row["status"] == "pass":
                    log(f"  profiling {case.name} {batch}x{seq} on {ep} ...")
                    runtime = _ort_runtime(settings, ep)
                    row["profile"] = ort_op_profile(runtime, paths[case.name], feeds)
                if row["status"] == "pass":
                    log(f"  p50 {row['p50_ms']} ms, p90 {row['p90_ms']} ms ({row['runs']} runs)")
                rows.append(row)
    for ep, ceiling in ceilings.items():
        _remeasure_ceiling(settings, ep, ceiling, rows, log)
    return {
        "tool": "tconform bench",
        "schema": SCHEMA,
        "environment": environment(started, settings.threads),
        "settings": settings.record(),
        "ceiling": ceilings.get("cpu") or next(iter(ceilings.values()), {}),
        "ceilings": ceilings,
        "unavailable": unavailable,
        "results": rows,
    }


def progress_bar(done: int, total: int, width: int = 20) -> str:
    """'[###.......] 3/10': how many of the run's measurements are finished."""
    filled = width * done // max(total, 1)
    return f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total}"


def _remeasure_ceiling(
    settings: BenchSettings, ep: str, ceiling: dict, rows: list[dict], log: Log
) -> None:
    """Measure the GEMM ceiling again after the timings and keep the higher: on a shared
    machine one measurement can land on someone else's burst of work, and a ceiling that is too
    low would flatter every fraction. The rows' fractions are recomputed against the result."""
    log(f"measuring the {ep} GEMM ceiling again ...")
    again = measure_ceiling(_ort_runtime(settings, ep))
    ceiling["gemm_gflops_runs"] = [ceiling["gemm_gflops"], again["gemm_gflops"]]
    ceiling["gemm_gflops"] = max(ceiling["gemm_gflops_runs"])
    for key in ("numpy_gemm_gflops", "copy_bandwidth_gbs"):
        if key in again:
            ceiling[key] = max(ceiling[key], again[key])
    for row in rows:
        if row["ep"] == ep and row.get("peak_fraction") is not None:
            row["peak_fraction"] = round(row["gflops"] / ceiling["gemm_gflops"], 3)
        if row["ep"] == ep and "weight_bytes" in row:
            bandwidth = ceiling["copy_bandwidth_gbs"] * 1e9
            row["memory_floor_ms"] = round_sig(row["weight_bytes"] / bandwidth * 1e3)


def _export(settings: BenchSettings, log: Log) -> dict[str, Path]:
    log(
        f"exporting {len(settings.cases)} models at preset {settings.preset} to "
        f"{settings.artifacts} (cached; the base whole model is ~400 MB and takes a minute) ..."
    )
    records = export_cases(
        settings.cases,
        ExportSettings(settings.cfg),
        settings.artifacts,
        on_done=lambda r: log(f"  {r.location}: {'reused' if r.cached else 'exported'}"),
    )
    return {r.case: settings.artifacts / r.path for r in records}


def _ort_runtime(settings: BenchSettings, ep: str) -> OrtRuntime:
    return OrtRuntime(ep=ep, graph_opt=settings.graph_opt, intra_op_threads=settings.threads)


def _engines(settings, case, params, feeds, paths, ceilings):
    """(engine label, device, opener) for every engine that runs here, in report order."""
    for ep in ceilings:  # only providers that really run have a ceiling
        if "onnxruntime" in settings.engines:
            runtime = _ort_runtime(settings, ep)
            model = paths[case.name]
            yield "onnxruntime", ep, lambda r=runtime, m=model: open_ort(r, m, feeds, False)
            if "onnxruntime-fused" in settings.engines:
                yield (
                    "onnxruntime-fused",
                    ep,
                    lambda r=runtime, m=model: _open_fused(r, m, settings.cfg, feeds),
                )
            if ep == "cuda":
                yield (
                    "onnxruntime-iobinding",
                    ep,
                    lambda r=runtime, m=model: open_ort(r, m, feeds, True),
                )

    # torch on every provider it has a device for (CUDA only where torch sees one).
    devices = [ep for ep in ceilings if ep in TorchRuntime.eps]
    for device in devices:
        for engine, compiled in (("torch", False), ("torch-compile", True)):
            if engine in settings.engines:
                yield (
                    engine,
                    device,
                    lambda d=device, c=compiled: open_torch(
                        case, settings.cfg, params, feeds, d, c
                    ),
                )


def _open_fused(
    runtime: OrtRuntime, model: Path, cfg: ModelConfig, feeds: dict[str, np.ndarray]
) -> OpenedEngine:
    fused = fused_model(model, cfg)
    opened = open_ort(runtime, fused, feeds, False)
    opened.details["fused_ops"] = fused_op_counts(fused)
    return opened


def _measure(settings, case, batch, seq, engine, ep, opener, ceilings, log) -> dict:
    row: dict[str, object] = {
        "case": case.name,
        "engine": engine,
        "ep": ep,
        "batch": batch,
        "seq": seq,
        "threads": settings.threads,
        "graph_opt": settings.graph_opt if engine.startswith("onnxruntime") else None,
    }
    gc.collect()
    rss_before = current_rss_mb()
    peak_is_own = reset_peak_rss()
    try:
        opened: OpenedEngine = opener()
        times = timed_runs(opened.run, settings.warmup, settings.runs, settings.seconds)
    except Exception as exc:  # torch.compile, torch without CUDA, ...: say why, keep timing
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        log(f"  {case.name} {batch}x{seq} {engine}/{ep}: skipped: {reason}")
        return {**row, "status": "skip", "reason": reason}
    stats = latency_stats(times)
    flop = case.flop_count(settings.cfg, Shape(batch, seq, seq))
    gflops = flop / (stats.p50_ms / 1e3) / 1e9
    ceiling = ceilings.get(ep, {})
    row.update(
        status="pass",
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
        peak_mem_mb=round(peak_rss_mb(), 1),
        peak_mem_delta_mb=round(peak_rss_mb() - rss_before, 1),
        peak_mem_method="VmHWM reset per engine" if peak_is_own else "process lifetime maxrss",
        device_mem_mb=opened.device_memory_mb(),
        details=opened.details,
    )
    if ep == "cpu" and batch == 1 and "copy_bandwidth_gbs" in ceiling:
        weight_bytes = case.weight_bytes_read(settings.cfg, Shape(batch, seq, seq))
        row["weight_bytes"] = weight_bytes
        row["memory_floor_ms"] = round_sig(weight_bytes / (ceiling["copy_bandwidth_gbs"] * 1e6))
    opened.close()
    del opened
    return row


# --- per-op profile ------------------------------------------------------------------------------


@dataclass
class ProfilingOrtRuntime(OrtRuntime):
    """OrtRuntime whose sessions write ONNX Runtime's profile (enable_profiling)."""

    profile_prefix: str = "ort_profile"

    def session_options(self):
        options = super().session_options()
        options.enable_profiling = True
        options.profile_file_prefix = self.profile_prefix
        return options


def profile_by_op_type(events: list[dict], skip_runs: int = 0) -> dict[str, float]:
    """Total kernel microseconds per op type from ONNX Runtime's profile events, leaving out
    the kernels of the first `skip_runs` runs (the warm-up, which allocates and is slower)."""
    starts = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    since = starts[skip_runs] if 0 < skip_runs < len(starts) else float("-inf")
    totals: Counter[str] = Counter()
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        if event.get("ts", 0) >= since:
            totals[event.get("args", {}).get("op_name", "?")] += float(event.get("dur", 0))
    return dict(totals)


def ort_op_profile(
    runtime: OrtRuntime, model: Path, feeds: dict[str, np.ndarray], runs: int = 3
) -> dict[str, dict[str, float]]:
    """{op type: {"ms_per_run", "share"}} over `runs` profiled runs, biggest first."""
    import json

    with tempfile.TemporaryDirectory() as tmp:
        profiling = ProfilingOrtRuntime(
            runtime.ep,
            runtime.graph_opt,
            runtime.intra_op_threads,
            profile_prefix=str(Path(tmp) / "profile"),
        )
        session = profiling.open(model).session
        for _ in range(1 + runs):  # one warm-up, left out of the totals
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    totals = profile_by_op_type(events, skip_runs=1)
    grand = sum(totals.values()) or 1.0
    return {
        op: {"ms_per_run": round(us / runs / 1e3, 3), "share": round(us / grand, 3)}
        for op, us in sorted(totals.items(), key=lambda kv: -kv[1])
    }

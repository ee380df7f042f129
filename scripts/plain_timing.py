"""Re-time what `tconform bench` reported with plain onnxruntime and torch calls, outside
tconform's timing code, as a cross-check of its p50s (docs/performance.md).

    python scripts/plain_timing.py BENCH.json [--runs 20] [--json OUT.json]

For every "best" entry of the bench report (the fastest ONNX Runtime variant per case, shape
and provider; CPU only), it loads the same model file with the same threads, session config
and disabled graph transformers, and times it on the same inputs, with intra-op spinning as the
bench had it, the other way, and with the worker threads pinned to cores
(session.intra_op_thread_affinities); then the torch reference in eager mode. Each figure is
the median of --runs calls after 2 warm-ups. It prints whether the plain p50 agrees with the
bench's within 35 %.
"""

from __future__ import annotations

import json
import time

import numpy as np
import onnxruntime as ort
import torch
from bench_report import best_cpu_rows, read_bench_report

from tconform import registry
from tconform.config import get_preset
from tconform.export import ExportSettings, build_module
from tconform.runtimes.onnxruntime import DENORMAL_AS_ZERO

AGREEMENT = 0.35
SPINNING = "session.intra_op.allow_spinning"


def median_ms(run, runs: int, warmup: int = 2) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return float(np.median(times) * 1e3)


def ort_session(
    model: str, threads: int, config: dict[str, str], disabled_optimizers: list[str]
) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    for key, value in config.items():
        options.add_session_config_entry(key, value)
    session = ort.InferenceSession(
        model,
        options,
        providers=["CPUExecutionProvider"],
        disabled_optimizers=disabled_optimizers,
    )
    # ONNX Runtime sets the calling thread's subnormal flags for a process's first session only;
    # set them as this session asks, as the bench does (OrtRuntime.match_calling_thread).
    torch.set_flush_denormal(config.get(DENORMAL_AS_ZERO) == "1")
    return session


def session_configs(bench_config: dict[str, str], threads: int) -> dict[str, dict[str, str]]:
    """The bench's own session config, spinning the other way, and pinned worker threads (one
    logical processor each, 1-based, after the first, which the calling thread shares)."""
    flipped = "0" if bench_config.get(SPINNING, "1") == "1" else "1"
    pinned = ";".join(str(cpu) for cpu in range(2, threads + 1))
    configs = {
        "as bench": dict(bench_config),
        f"spinning={flipped}": {**bench_config, SPINNING: flipped},
    }
    if pinned:
        configs["pinned"] = {**bench_config, "session.intra_op_thread_affinities": pinned}
    return configs


def main() -> None:
    args, report = read_bench_report(__doc__.splitlines()[0], runs=20)
    settings = report["settings"]
    cfg, threads = get_preset(settings["preset"]), settings["intra_op_threads"]
    torch.set_num_threads(threads)
    checks = []
    for best, row in best_cpu_rows(report):
        case = registry.get_case(best["case"])
        shape = registry.Shape(best["batch"], best["seq"], best["seq"])
        feeds = registry.make_inputs(case, cfg, shape, np.random.default_rng(0))  # as bench
        runs = max(3, args.runs if best["batch"] * best["seq"] <= 256 else args.runs // 4)
        figures = {}
        for name, config in session_configs(settings.get("session_config", {}), threads).items():
            disabled = settings.get("disabled_optimizers", {})  # as bench had them
            if isinstance(disabled, dict):  # per provider; reports of 2026-11-23 have one list
                disabled = disabled.get("cpu", [])
            session = ort_session(row["details"]["model"], threads, config, disabled)
            run = lambda s=session, f=feeds: s.run(None, f)  # noqa: E731
            figures[f"onnxruntime {name}"] = median_ms(run, runs)
            del session
        torch.set_flush_denormal(False)  # as bench: torch with its defaults (engines.py)
        module, _ = build_module(case, ExportSettings(cfg))  # the export's module and weights
        tensors = [torch.from_numpy(feeds[spec.name]) for spec in case.inputs(cfg)]
        with torch.inference_mode():
            figures["torch eager"] = median_ms(lambda m=module, t=tensors: m(*t), runs)
        plain = figures["onnxruntime as bench"]
        agrees = abs(plain / best["p50_ms"] - 1) <= AGREEMENT
        what = f"{best['case']} {best['batch']}x{best['seq']} {best['best_engine']}"
        for name, ms in figures.items():
            print(f"{what}: {name:28s} p50 {ms:9.2f} ms")
        verdict = "yes" if agrees else "NO"
        print(
            f"{what}: bench p50 {best['p50_ms']} ms, plain {plain:.2f} ms "
            f"(ratio {plain / best['p50_ms']:.2f}; within {AGREEMENT:.0%}: {verdict})"
        )
        checks.append({**best, "plain_timing_ms": figures, "runs": runs, "agrees": agrees})
    if args.json:
        args.json.write_text(json.dumps({"bench": str(args.bench), "checks": checks}, indent=2))


if __name__ == "__main__":
    main()

"""verify: run every case's model on every golden input set, per runtime, and compare.

The runtimes are ONNX Runtime on each requested execution provider, and the PyTorch reference in
float32 as its own row, so torch's error against the exact golden is seen next to ORT's. Every
result records the providers the session really used.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tconform import doc, golden, registry
from tconform.compare import compare_output, tolerance_for
from tconform.errors import ProviderUnavailable
from tconform.export import ExportJob, ExportRecord, ExportSettings, export_jobs, read_manifest
from tconform.fp16 import float16_notes
from tconform.registry import Case
from tconform.results import Result, exit_code
from tconform.runtimes.onnxruntime import KernelMissing, OrtRuntime
from tconform.runtimes.torch import TorchRuntime


@dataclass
class VerifyOptions:
    golden_dir: Path = Path("golden")
    artifacts_dir: Path = Path("artifacts")
    eps: list[str] = field(default_factory=lambda: ["cpu"])
    cases: tuple[str, ...] = ()
    allow_missing_ep: bool = False
    strict_placement: bool = False
    tf32: bool = False
    device_id: int = 0
    provider_options: dict[str, str] = field(default_factory=dict)
    with_torch: bool = True
    with_doc: bool = True


@dataclass
class VerifyRun:
    results: list[Result]
    exports: list[ExportRecord]
    settings: dict[str, object]

    @property
    def exit_code(self) -> int:
        return exit_code(r.status for r in self.results)


Progress = Callable[[str], None]


def _artifact_dtype(artifacts_dir: Path) -> str:
    """Models in an existing artifacts folder keep their dtype (a float16 export stays fp16)."""
    return read_manifest(artifacts_dir).get("dtype", "float32")


def _precision(dtype: str, runtime: OrtRuntime) -> str:
    return "float16" if dtype == "float16" else runtime.precision


def _compare_set(result: Result, case: Case, outputs, input_set: golden.InputSet, precision: str):
    tol = tolerance_for(precision, case.tolerance)
    result.outputs = [
        compare_output(name, actual, input_set.outputs[name], tol)
        for name, actual in zip(input_set.outputs, outputs, strict=True)
    ]
    failed = [o for o in result.outputs if o.status == "fail"]
    result.status = "fail" if failed else "pass"
    result.message = "; ".join(f"{o.name}: {o.message}" for o in failed)


def _feeds(inputs: dict[str, np.ndarray], precision: str) -> dict[str, np.ndarray]:
    """Golden float inputs are float32; a float16 model takes them rounded to float16."""
    if precision != "float16":
        return inputs
    return {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in inputs.items()}


def _run_sets(session, case, sets, template: Result, precision: str) -> list[Result]:
    results = []
    for input_set in sets:
        result = Result(**{**template.__dict__, "input_set": input_set.name})
        started = time.perf_counter()
        try:
            outputs = session.run(_feeds(input_set.inputs, precision))
        except Exception as exc:  # a runtime error on valid inputs is a conformance failure
            result.status, result.message = "error", f"{type(exc).__name__}: {exc}".splitlines()[0]
        else:
            _compare_set(result, case, outputs, input_set, precision)
        result.seconds = time.perf_counter() - started
        results.append(result)
    return results


def _ort_results(case, sets, model_path, runtime: OrtRuntime, dtype, options) -> list[Result]:
    precision = _precision(dtype, runtime)
    template = Result(
        case.name, case.component, "onnxruntime", runtime.ep, [], "", "pass", precision=precision
    )
    try:
        session = runtime.open(model_path)
    except (ProviderUnavailable, KernelMissing) as exc:
        # A missing float16 kernel is a fact about the runtime, reported, not a failure.
        missing_ep = isinstance(exc, ProviderUnavailable) and not options.allow_missing_ep
        status = "unavailable" if missing_ep else "skip"
        return [
            Result(**{**template.__dict__, "input_set": "*", "status": status, "message": str(exc)})
        ]
    template.ep_actual = list(session.providers)
    template.placement = dict(session.placement)
    template.fallback_ops = dict(session.fallback_ops)
    if dtype == "float16":
        template.notes = float16_notes(model_path, runtime.ep)
    results = _run_sets(session, case, sets, template, precision)
    if template.fallback_ops:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(template.fallback_ops.items()))
        note = f"warning: nodes fell back to the CPU provider: {ops}"
        for r in results:
            r.notes = [note, *r.notes]
            if options.strict_placement and r.status == "pass":
                r.status, r.message = "fail", f"{note} (--strict-placement)"
    return results


def verify(options: VerifyOptions, progress: Progress = lambda _: None) -> VerifyRun:
    manifest = golden.read_manifest(options.golden_dir)
    cfg, seed = golden.manifest_config(manifest), int(manifest["seed"])
    cases = registry.select_cases(options.cases or tuple(manifest["cases"]))
    dtype = _artifact_dtype(options.artifacts_dir)
    exporter = read_manifest(options.artifacts_dir).get("exporter", "dynamo")

    settings = ExportSettings(cfg, seed, exporter=exporter, dtype=dtype)
    jobs = [ExportJob(case, settings, options.artifacts_dir) for case in cases]
    # The document checks' models join the same pool of export processes.
    doc_jobs = doc.required_exports(options.artifacts_dir) if options.with_doc else []
    extra = f" + {len(doc_jobs)} for the document checks" if doc_jobs else ""
    progress(f"models: {len(jobs)}{extra}, exported where not current, in {options.artifacts_dir}")
    exports = export_jobs(
        jobs + doc_jobs,
        on_done=lambda r: progress(f"  {r.location}: {'reused' if r.cached else 'exported'}"),
        repair=False,
    )[: len(jobs)]
    runtimes = [
        OrtRuntime(
            ep,
            tf32=options.tf32,
            device_id=options.device_id,
            provider_options=options.provider_options,
        )
        for ep in options.eps
    ]
    results: list[Result] = []
    for n, case in enumerate(cases, 1):
        progress(f"[{n}/{len(cases)}] {case.name}")
        sets = golden.read_case(options.golden_dir, manifest, case, cfg)
        model_path = options.artifacts_dir / case.name / "model.onnx"
        for runtime in runtimes:
            results += _ort_results(case, sets, model_path, runtime, dtype, options)
        if options.with_torch:
            session = TorchRuntime().open(case, cfg, golden.case_params(case, cfg, seed))
            template = Result(
                case.name, case.component, "torch", "cpu", session.providers, "", "pass"
            )
            results += _run_sets(session, case, sets, template, "float32")
    if options.with_doc:
        progress("document checks")
        results += doc.verify_results(options.eps, options.artifacts_dir)
    settings = {
        "golden": str(options.golden_dir),
        "artifacts": str(options.artifacts_dir),
        "preset": manifest.get("preset"),
        "config": cfg.to_dict(),
        "seed": seed,
        "dtype": dtype,
        "exporter": exporter,
        "eps": options.eps,
        "runtimes": {r.name: r.settings() for r in runtimes},
    }
    return VerifyRun(results, exports, settings)

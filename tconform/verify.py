"""verify: run every case's model on every golden input set, per runtime, and compare.

The runtimes are ONNX Runtime on each requested execution provider, and the PyTorch reference in
float32 as its own row, so torch's error against the exact golden is seen next to ORT's. Every
result records the providers the session really used and the exact model that ran (path,
sha256, origin).

Which model stands for a case:
  --model CASE=PATH   the given file, read-only, whatever the artifacts folder holds;
  --no-export         whatever the artifacts folder holds, as it is (nothing is exported);
  otherwise           tconform's own export in the artifacts folder, exported where missing or
                      stale (only tconform's own unchanged files are ever replaced).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path

import numpy as np

from tconform import doc, golden, registry
from tconform.compare import compare_output, tolerance_for
from tconform.config import ModelConfig
from tconform.errors import ProviderUnavailable, UsageError
from tconform.export import (
    ExportJob,
    ExportRecord,
    ExportSettings,
    cache_key,
    default_opset,
    export_jobs,
    folder_settings,
    read_manifest,
)
from tconform.files import sha256_file
from tconform.folders import folder_lock
from tconform.fp16 import float16_notes
from tconform.models import ModelUnderTest, given_model
from tconform.module_check.localise import Localisation
from tconform.provenance import module_provenance
from tconform.registry import Case
from tconform.report import RunReport
from tconform.results import Result, allow_missing
from tconform.runtimes import Runtime, Subject, label, make_runtime, open_subject, runtime_class
from tconform.runtimes.onnxruntime import KernelMissing


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
    models: dict[str, Path] = field(default_factory=dict)  # --model CASE=PATH
    export: bool = True  # False: --no-export, verify what the artifacts folder holds
    runtimes: tuple[str, ...] = ("onnxruntime", "torch")  # names in tconform.runtimes.RUNTIMES
    localise: bool = False  # name the first diverging submodule of each failing ORT result
    attention: str | None = None  # --attention: the kernel the models must use [folder's own]


Progress = Callable[[str], None]


def select_cases(options: VerifyOptions, manifest: dict, golden_dir: Path) -> tuple[Case, ...]:
    """The cases to check. Named ones (--case, --model) must all have goldens; a plain run
    checks every registry case, so a golden folder missing one is an error, not a smaller pass."""
    named = (*options.cases, *options.models)
    if named:
        cases = registry.select_cases(named)
        for case in cases:
            if case.name not in manifest["cases"]:
                raise UsageError(f"{golden_dir}: no goldens for case {case.name!r}")
        return cases
    missing = [name for name in registry.case_names() if name not in manifest["cases"]]
    if missing:
        raise UsageError(
            f"{golden_dir}: no goldens for case {missing[0]!r} (a plain verify checks every "
            "case; name the ones this folder holds with --case)"
        )
    return registry.CASES


def _artifact_settings(options: VerifyOptions, cfg: ModelConfig, seed: int) -> ExportSettings:
    """Export settings for the artifacts folder: the folder's own (a float16 folder stays
    float16, a TorchScript folder TorchScript), or tconform's defaults for a new folder. An
    --attention kernel other than the folder's is refused: a folder holds one kernel's graphs."""
    held = folder_settings(options.artifacts_dir) or {}
    attention = options.attention or str(held.get("attention", "plain"))
    if held and held["attention"] != attention:
        raise UsageError(
            f"{options.artifacts_dir} holds {held['attention']}-attention models; verify "
            f"--attention {attention} with an --artifacts folder of its own"
        )
    return ExportSettings(
        cfg,
        seed,
        exporter=str(held.get("exporter", "dynamo")),
        opset=int(held["opset"]) if held.get("opset") else default_opset(attention),
        dtype=str(held.get("dtype", "float32")),
        attention=attention,
    )


def _from_record(case: Case, record: ExportRecord, note: str = "") -> ModelUnderTest:
    path = Path(record.location)
    notes = (note,) if note else ()
    if record.attention_nodes:  # the variant is part of what was checked
        notes += (f"{record.attention} attention: {record.attention_nodes} ONNX Attention nodes",)
    return ModelUnderTest(case, path, record.provenance(), notes)


def _held_model(
    case: Case, cfg: ModelConfig, artifacts_dir: Path, manifest: dict, key: str
) -> ModelUnderTest:
    """--no-export: the case's file in the artifacts folder, as it is. tconform's own unchanged
    file is `cached`; anything else is checked like a given model."""
    path = artifacts_dir / case.name / "model.onnx"
    if not path.exists():
        raise UsageError(f"{path}: missing (--no-export exports nothing; run `tconform export`)")
    entry = manifest.get("models", {}).get(case.name)
    if entry is None:
        return given_model(case, cfg, path)
    if not path.is_file() or sha256_file(path) != entry.get("sha256"):
        model = given_model(case, cfg, path)
        return ModelUnderTest(
            case, path, model.provenance, ("changed since tconform wrote it: verified as given",)
        )
    record = ExportRecord.from_manifest(entry, artifacts_dir)
    stale = entry.get("key") != key
    note = "exported by another version of tconform or its libraries (cache key differs)"
    return _from_record(case, record, note if stale else "")


def models_under_test(
    options: VerifyOptions,
    cases: tuple[Case, ...],
    settings: ExportSettings,
    doc_jobs: list[ExportJob],
    progress: Progress,
) -> tuple[dict[str, ModelUnderTest], list[ExportRecord]]:
    """The model file for every case (given ones checked first, before any slow export), and
    the records of the document checks' models, exported in the same pool."""
    chosen = {
        name: given_model(registry.get_case(name), settings.cfg, path)
        for name, path in options.models.items()
    }
    for name, model in chosen.items():
        progress(f"  {name}: the given model {model.path} (sha256 {model.provenance.sha256[:12]})")
    rest = [case for case in cases if case.name not in chosen]
    if not options.export:
        manifest = read_manifest(options.artifacts_dir)
        for case in rest:
            key = cache_key(case, settings)
            chosen[case.name] = _held_model(
                case, settings.cfg, options.artifacts_dir, manifest, key
            )
        return chosen, []
    jobs = [ExportJob(case, settings, options.artifacts_dir) for case in rest]
    extra = f" + {len(doc_jobs)} for the document checks" if doc_jobs else ""
    progress(f"models: {len(jobs)}{extra}, exported where not current, in {options.artifacts_dir}")
    records = export_jobs(
        jobs + doc_jobs,
        on_done=lambda r: progress(f"  {r.location}: {'reused' if r.cached else 'exported'}"),
    )
    for case, record in zip(rest, records[: len(rest)], strict=True):
        chosen[case.name] = _from_record(case, record)
    return chosen, records[len(rest) :]


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


def _runtime_results(
    runtime: Runtime, model: ModelUnderTest, subject: Subject, sets, options: VerifyOptions
) -> list[Result]:
    """One result per input set of `model`'s case on `runtime` (or one `unavailable`/`skip`
    result saying why it could not run)."""
    case = model.case
    onnx_file = runtime.consumes == "onnx"
    precision = "float16" if onnx_file and model.precision == "float16" else runtime.precision
    template = Result(
        case.name,
        case.component,
        runtime.name,
        runtime.ep,
        [],
        "",
        "pass",
        precision=precision,
        model=model.provenance if onnx_file else None,
        notes=list(model.notes) if onnx_file else [],
    )
    try:
        session = open_subject(runtime, subject)
    except (ProviderUnavailable, KernelMissing) as exc:
        # A missing float16 kernel is a fact about the runtime, reported, not a failure.
        status = "unavailable" if isinstance(exc, ProviderUnavailable) else "skip"
        return [
            Result(**{**template.__dict__, "input_set": "*", "status": status, "message": str(exc)})
        ]
    if onnx_file:
        model.confirm_unchanged()  # the session holds exactly the bytes the provenance names
    else:
        template.model = module_provenance(session.module, runtime.precision)
    template.ep_actual = list(session.providers)
    template.placement = dict(session.placement)
    template.fallback_ops = dict(session.fallback_ops)
    if precision == "float16" and runtime.name == "onnxruntime":
        template.notes += float16_notes(model.path, runtime.ep)
    results = _run_sets(session, case, sets, template, precision)
    if template.fallback_ops:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(template.fallback_ops.items()))
        note = f"warning: nodes fell back to the CPU provider: {ops}"
        for r in results:
            r.notes = [note, *r.notes]
            if options.strict_placement and r.status == "pass":
                r.status, r.message = "fail", f"{note} (--strict-placement)"
    return results


def _localise_failures(
    runtime: Runtime, model: ModelUnderTest, results: list[Result], sets, cfg, seed
) -> list[Localisation]:
    """Localise the case's first failing input set on one ONNX Runtime provider (tconform
    check's machinery, against the case's float64 reference module); the verdict joins each
    failing result as a note."""
    from tconform.module_check.localise import localise_case

    failing = [r for r in results if r.status == "fail"]
    if not failing or runtime.name != "onnxruntime":
        return []
    first = failing[0]
    input_set = next(s for s in sets if s.name == first.input_set)
    tol = tolerance_for(first.precision, model.case.tolerance)
    feeds = _feeds(input_set.inputs, first.precision)
    try:
        found = localise_case(
            model.case.name, model.path, feeds, cfg, seed, runtime, tol, model.provenance
        )
    except Exception as exc:  # localisation explains a failure; it never replaces one
        for r in failing:
            r.notes.append(f"localisation could not run: {type(exc).__name__}: {exc}")
        return []
    for r in failing:
        r.notes.append(f"localisation ({input_set.name}): {found.verdict}")
        if found.first is not None:
            r.message += f"; first divergence: {found.first.label} ({found.first.cls})"
    return [found]


def verify_runtimes(options: VerifyOptions) -> list[Runtime]:
    """Every requested runtime on every requested provider it supports."""
    names = [n for n in options.runtimes if options.with_torch or n != "torch"]
    shared = {
        "tf32": options.tf32,
        "device_id": options.device_id,
        "provider_options": options.provider_options,
    }
    runtimes = []
    for name in names:
        cls = runtime_class(name)
        accepted = {f.name for f in dataclass_fields(cls)}
        for ep in options.eps:
            if ep in cls.eps:
                runtimes.append(
                    make_runtime(name, ep, **{k: v for k, v in shared.items() if k in accepted})
                )
    return runtimes


def verify(options: VerifyOptions, report: RunReport, progress: Progress = lambda _: None) -> None:
    """Fill `report` with one result per case, runtime and input set (and the settings that
    produced them). Results land in `report` as they come, so an error that stops the run
    midway leaves the results so far in place for the reports."""
    if not verify_runtimes(options):
        raise UsageError("nothing to run: no runtime runs on the requested providers")
    with ExitStack() as locks:
        # The goldens are read under a shared lock (a `golden --force` waits); the artifacts
        # folder is locked exclusively while models are exported, shared while they run.
        locks.enter_context(folder_lock(options.golden_dir, shared=True))
        _verify_locked(options, report, progress, locks)


def _verify_locked(
    options: VerifyOptions, report: RunReport, progress: Progress, locks: ExitStack
) -> None:
    manifest = golden.read_manifest(options.golden_dir)
    cfg, seed = golden.manifest_config(manifest), int(manifest["seed"])
    cases = select_cases(options, manifest, options.golden_dir)
    settings = _artifact_settings(options, cfg, seed)
    with_doc = options.with_doc and options.export
    runtimes = verify_runtimes(options)
    report.settings = {
        "golden": str(options.golden_dir),
        "golden_manifest_sha256": sha256_file(options.golden_dir / golden.MANIFEST),
        "artifacts": str(options.artifacts_dir),
        "export": options.export,
        "given_models": {name: str(path) for name, path in options.models.items()},
        "document_checks": with_doc,
        "cases": [case.name for case in cases],
        "preset": manifest.get("preset"),
        "config": cfg.to_dict(),
        "seed": seed,
        "dtype": settings.dtype,
        "exporter": settings.exporter,
        "opset": settings.opset,
        "attention": settings.attention,
        "eps": options.eps,
        "allow_missing_ep": options.allow_missing_ep,
        "runtimes": {label(r): r.settings() for r in runtimes},
        "localise": options.localise,
    }
    if options.with_doc and not options.export:
        progress("document checks: not run (--no-export exports nothing; `tconform doc` runs them)")
    if options.models and not options.export:
        progress("--model wins over the artifacts folder for: " + ", ".join(options.models))
    # The document checks' models join the same pool of export processes.
    doc_jobs = doc.required_exports(options.artifacts_dir) if with_doc else []
    models, doc_records = models_under_test(options, cases, settings, doc_jobs, progress)
    if options.artifacts_dir.is_dir():
        locks.enter_context(folder_lock(options.artifacts_dir, shared=True))
    localisations: list[Localisation] = []
    for n, case in enumerate(cases, 1):
        progress(f"[{n}/{len(cases)}] {case.name}")
        sets = golden.read_case(options.golden_dir, manifest, case, cfg)
        model = models[case.name]
        subject = Subject(model.path, case.module_target(cfg, case.make_params(cfg, seed)))
        for runtime in runtimes:
            results = _runtime_results(runtime, model, subject, sets, options)
            if options.localise:
                localisations += _localise_failures(runtime, model, results, sets, cfg, seed)
            report.results += results
    if localisations:
        report.details["localisation"] = [found.to_dict() for found in localisations]
    if with_doc:
        progress("document checks")
        report.results += doc.verify_results(
            options.eps,
            options.artifacts_dir,
            doc_records,
            tf32=options.tf32,
            device_id=options.device_id,
            provider_options=options.provider_options,
        )
    if options.allow_missing_ep:
        report.results = allow_missing(report.results)

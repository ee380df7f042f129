"""Which model each lane of a verify run checks: a given file (`--model CASE=PATH`, read-only),
the artifacts folder's file as it is (`--no-export`), or tconform's own export, made current
where missing or stale in one pool with the document checks' models; a `--matrix` run exports
each (case, export cell) once into artifacts/matrix/<exporter>-opset<N>-<dtype>/.
"""

from __future__ import annotations

from tconform import registry
from tconform.config import ModelConfig
from tconform.export import (
    ExportJob,
    ExportRecord,
    ExportSettings,
    cache_key,
    export_jobs,
    read_artifacts_manifest,
)
from tconform.models import ModelUnderTest, given_model, held_model, model_from_record
from tconform.plan import Lane, Plan, Progress, VerifyOptions, artifact_settings
from tconform.registry import Case

MATRIX_FOLDER = "matrix"  # artifacts/matrix/<export cell>/: one folder per exporter, opset, dtype


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
        manifest = read_artifacts_manifest(options.artifacts_dir)
        for case in rest:
            key = cache_key(case, settings)
            chosen[case.name] = held_model(case, settings.cfg, options.artifacts_dir, manifest, key)
        return chosen, []
    jobs = [ExportJob(case, settings, options.artifacts_dir) for case in rest]
    extra = f" + {len(doc_jobs)} for the document checks" if doc_jobs else ""
    progress(f"models: {len(jobs)}{extra}, exported where not current, in {options.artifacts_dir}")
    records = export_jobs(
        jobs + doc_jobs,
        on_done=lambda r: progress(f"  {r.location}: {'reused' if r.cached else 'exported'}"),
    )
    for case, record in zip(rest, records[: len(rest)], strict=True):
        chosen[case.name] = model_from_record(case, record)
    return chosen, records[len(rest) :]


def matrix_models(
    options: VerifyOptions,
    lanes: list[Lane],
    cfg: ModelConfig,
    seed: int,
    doc_jobs: list[ExportJob],
    progress: Progress,
) -> tuple[dict[tuple[str, str], ModelUnderTest], list[ExportRecord]]:
    """Each (case, export cell) the lanes need, exported once into artifacts/matrix/<export>/
    (or reused there), and the document checks' models in the same pool."""
    needed = {
        lane.model_key: lane
        for lane in lanes
        if lane.export is not None and not lane.not_applicable
    }
    jobs = [
        ExportJob(
            lane.case,
            ExportSettings(cfg, seed, lane.export.exporter, lane.export.opset, lane.export.dtype),
            options.artifacts_dir / MATRIX_FOLDER / lane.export.export_key,
        )
        for lane in needed.values()
    ]
    progress(f"models: {len(jobs)} exports of the matrix, exported where not current")
    records = export_jobs(
        jobs + doc_jobs,
        on_done=lambda r: progress(f"  {r.location}: {'reused' if r.cached else 'exported'}"),
    )
    models = {
        key: model_from_record(lane.case, record)
        for (key, lane), record in zip(needed.items(), records[: len(jobs)], strict=True)
    }
    return models, records[len(jobs) :]


def lane_models(
    options: VerifyOptions,
    planned: Plan,
    lanes: list[Lane],
    doc_jobs: list[ExportJob],
    progress: Progress,
) -> tuple[dict[tuple[str, str], ModelUnderTest], list[ExportRecord]]:
    """The model of every ONNX lane, by `Lane.model_key`, and the records of the document
    checks' models, settled in the same pool of export processes."""
    cfg, seed = planned.cfg, planned.seed
    if options.matrix:
        return matrix_models(options, lanes, cfg, seed, doc_jobs, progress)
    onnx_cases = tuple(
        dict.fromkeys(lane.case for lane in lanes if lane.runtime.consumes == "onnx")
    )
    settings = artifact_settings(options, cfg, seed)
    by_case, doc_records = models_under_test(options, onnx_cases, settings, doc_jobs, progress)
    models = {
        lane.model_key: by_case[lane.case.name] for lane in lanes if lane.case.name in by_case
    }
    return models, doc_records

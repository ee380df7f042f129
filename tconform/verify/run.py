"""verify: every case's model on every golden input set, per runtime, compared with the goldens.

The orchestration, top to bottom: the plan (tconform.plan), the models each lane checks
(tconform.verify.models), the lanes' results (tconform.verify.execute) and the document checks,
all landing in one RunReport as they come. Every result records the providers the session really
used and the exact model that ran (path, sha256, origin).

Which model stands for a case:
  --model CASE=PATH   the given file, read-only, whatever the artifacts folder holds;
  --no-export         whatever the artifacts folder holds, as it is (nothing is exported);
  otherwise           tconform's own export in the artifacts folder, exported where missing or
                      stale (only tconform's own unchanged files are ever replaced).
"""

from __future__ import annotations

from contextlib import ExitStack

from tconform import doc, golden
from tconform.errors import EXIT_EP_UNAVAILABLE, TconformError, UsageError
from tconform.files import sha256_file
from tconform.folders import folder_lock
from tconform.localise import Localisation
from tconform.plan import (
    Lane,
    Plan,
    Progress,
    VerifyOptions,
    artifact_settings,
    matrix_cells,
    plan,
    select_units,
    verify_runtimes,
)
from tconform.report import RunReport
from tconform.results import allow_missing
from tconform.runtimes import label
from tconform.units import Unit, digest, documents_unit, unchecked_models, unit_id
from tconform.verify.execute import lane_results, localise_failures
from tconform.verify.models import lane_models


def verify(options: VerifyOptions, report: RunReport, progress: Progress = lambda _: None) -> None:
    """Fill `report` with one result per case, runtime and input set (and the settings that
    produced them). Results land in `report` as they come, so an error that stops the run
    midway leaves the results so far in place for the reports."""
    if not verify_runtimes(options):
        raise UsageError("nothing to run: no runtime runs on the requested providers")
    if options.matrix and (options.models or not options.export):
        raise UsageError(
            "--matrix exports its own models: it takes neither --model nor --no-export"
        )
    with ExitStack() as locks:
        # The goldens are read under a shared lock (a `golden --force` waits); the artifacts
        # folder is locked exclusively while models are exported, shared while they run.
        locks.enter_context(folder_lock(options.golden_dir, shared=True))
        _verify_locked(options, report, progress, locks)


def _verify_locked(
    options: VerifyOptions, report: RunReport, progress: Progress, locks: ExitStack
) -> None:
    planned = plan(options)
    mine = select_units(options, planned.units)
    mine_ids = {u.id for u in mine}
    lanes = [
        lane for lane in planned.lanes if any(u.id in mine_ids for u in planned.units_of(lane))
    ]
    with_doc = options.with_doc and options.export and documents_unit().id in mine_ids
    report.settings = _settings(options, planned, lanes, mine, with_doc)
    if options.with_doc and not options.export:
        progress("document checks: not run (--no-export exports nothing; `tconform doc` runs them)")
    if options.models and not options.export:
        progress("--model wins over the artifacts folder for: " + ", ".join(options.models))
    if options.shard:
        index, count = options.shard
        progress(f"shard {index}/{count}: {len(mine)} of {len(planned.units)} units")
    # The document checks' models join the same pool of export processes.
    doc_jobs = doc.required_exports(options.artifacts_dir) if with_doc else []
    models, doc_records = lane_models(options, planned, lanes, doc_jobs, progress)
    if options.artifacts_dir.is_dir():
        locks.enter_context(folder_lock(options.artifacts_dir, shared=True))
    cfg, seed = planned.cfg, planned.seed
    localisations: list[Localisation] = []
    run_cases = list(dict.fromkeys(lane.case for lane in lanes))
    for n, case in enumerate(run_cases, 1):
        progress(f"[{n}/{len(run_cases)}] {case.name}")
        sets = golden.read_case(options.golden_dir, planned.manifest, case, cfg)
        params = case.make_params(cfg, seed)
        for lane in (lane for lane in lanes if lane.case == case):
            lane_sets = [
                s
                for s in sets
                if unit_id(case.name, lane.cell, label(lane.runtime), s.name) in mine_ids
            ]
            preset = planned.manifest.get("preset")  # the goldens' (a row measured for it)
            results = lane_results(lane, models, params, cfg, lane_sets, options, preset)
            if options.localise and lane.runtime.consumes == "onnx" and not lane.not_applicable:
                model = models[lane.model_key]
                localisations += localise_failures(
                    lane.runtime, model, results, sets, cfg, seed, preset
                )
            report.results += results
    if localisations:
        report.details["localisation"] = [found.to_dict() for found in localisations]
    if with_doc:
        progress("document checks")
        doc_results = doc.verify_results(options.runtimes, options.artifacts_dir, doc_records)
        for r in doc_results:  # one unit for all of them (tconform.units.documents_unit)
            r.cell, r.unit = documents_unit().cell, documents_unit().id
        report.results += doc_results
    if options.allow_missing_ep:
        report.results = allow_missing(report.results)
    why = unchecked_models(report.results)
    if why and options.shard is None and options.only_units is None:  # `report merge` judges
        raise TconformError.with_code(why, EXIT_EP_UNAVAILABLE)  # a shard's part of the run


def _settings(
    options: VerifyOptions, planned: Plan, lanes: list[Lane], mine: list[Unit], with_doc: bool
) -> dict[str, object]:
    """What the run's report records of how it was made."""
    settings = None if options.matrix else artifact_settings(options, planned.cfg, planned.seed)
    units = planned.units
    return {
        "golden": str(options.golden_dir),
        "golden_manifest_sha256": sha256_file(options.golden_dir / golden.MANIFEST),
        "artifacts": str(options.artifacts_dir),
        "export": options.export,
        "given_models": {name: str(path) for name, path in options.models.items()},
        "document_checks": with_doc,
        "cases": [case.name for case in planned.cases],
        "preset": planned.manifest.get("preset"),
        "config": planned.cfg.to_dict(),
        "seed": planned.seed,
        # A matrix run: the axes; a plain run: the artifacts folder's one setting.
        "dtype": list(options.dtypes) if settings is None else settings.dtype,
        "exporter": list(options.exporters) if settings is None else settings.exporter,
        "opset": list(options.opsets) if settings is None else settings.opset,
        "attention": None if settings is None else settings.attention,
        "eps": list(options.runtimes.eps),
        "allow_missing_ep": options.allow_missing_ep,
        "runtimes": {label(lane.runtime): lane.runtime.settings() for lane in lanes},
        "localise": options.localise,
        "matrix": [cell.key for cell in matrix_cells(options)] if options.matrix else None,
        "units": {
            "total": len(units),
            "sha256": digest(u.id for u in units),
            "shard": f"{options.shard[0]}/{options.shard[1]}" if options.shard else None,
            "ids": [u.id for u in mine],
        },
    }

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

from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path

import numpy as np

from tconform import doc, golden, registry
from tconform.compare import judge_outputs, tolerance_for
from tconform.config import ModelConfig
from tconform.errors import UsageError
from tconform.execution import Subject, case_module, execute
from tconform.export import (
    DEFAULT_OPSET,
    ExportJob,
    ExportRecord,
    ExportSettings,
    cache_key,
    default_opset,
    export_jobs,
    folder_settings,
    read_manifest,
)
from tconform.files import require_inside, sha256_file
from tconform.folders import folder_lock
from tconform.models import ModelUnderTest, given_model
from tconform.module_check.localise import Localisation
from tconform.registry import Case
from tconform.report import RunReport
from tconform.results import Result, allow_missing
from tconform.runtimes import Runtime, RuntimeOptions, label, make_runtimes
from tconform.units import (
    GIVEN,
    MODULE,
    MODULE_SECONDS,
    RUN_SECONDS,
    Cell,
    Unit,
    digest,
    documents_unit,
    shard_units,
    unit_id,
)


@dataclass
class VerifyOptions:
    golden_dir: Path = Path("golden")
    artifacts_dir: Path = Path("artifacts")
    # which runtimes on which providers, with their options (--runtime, --ep, --tf32, ...)
    runtimes: RuntimeOptions = field(default_factory=RuntimeOptions)
    cases: tuple[str, ...] = ()
    allow_missing_ep: bool = False
    strict_placement: bool = False
    with_doc: bool = True
    models: dict[str, Path] = field(default_factory=dict)  # --model CASE=PATH
    export: bool = True  # False: --no-export, verify what the artifacts folder holds
    localise: bool = False  # name the first diverging submodule of each failing ORT result
    attention: str | None = None  # --attention: the kernel the models must use [folder's own]
    shard: tuple[int, int] | None = None  # --shard K/N: check only shard K of N
    only_units: frozenset[str] | None = None  # check only these unit ids (the pytest plugin)
    # --matrix: every cell of exporters x opsets x dtypes x graph_opts, exported under
    # artifacts/matrix/<exporter>-opset<N>-<dtype>/
    matrix: bool = False
    exporters: tuple[str, ...] = ("dynamo",)
    opsets: tuple[int, ...] = (DEFAULT_OPSET,)
    dtypes: tuple[str, ...] = ("float32",)
    graph_opts: tuple[str, ...] = ("all",)


Progress = Callable[[str], None]
MATRIX_FOLDER = "matrix"  # artifacts/matrix/<export cell>/: one folder per exporter, opset, dtype


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


def model_from_record(case: Case, record: ExportRecord, note: str = "") -> ModelUnderTest:
    path = Path(record.location)
    notes = (note,) if note else ()
    if record.attention_nodes:  # the variant is part of what was checked
        notes += (f"{record.attention} attention: {record.attention_nodes} ONNX Attention nodes",)
    return ModelUnderTest(case, path, record.provenance(), notes)


def held_model(
    case: Case, cfg: ModelConfig, artifacts_dir: Path, manifest: dict, key: str
) -> ModelUnderTest:
    """--no-export: the case's file in the artifacts folder, as it is. tconform's own unchanged
    file is `cached`; anything else is checked like a given model."""
    path = artifacts_dir / case.name / "model.onnx"
    if not path.exists():
        raise UsageError(f"{path}: missing (--no-export exports nothing; run `tconform export`)")
    require_inside(artifacts_dir, path)
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
    return model_from_record(case, record, note if stale else "")


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


def _judge(case: Case):
    """The goldens of `case`, each output under the case's tolerance row at the run's
    precision."""
    return judge_outputs(lambda precision, _: tolerance_for(precision, case.tolerance))


def _localise_failures(
    runtime: Runtime, model: ModelUnderTest, results: list[Result], sets, cfg, seed
) -> list[Localisation]:
    """Localise the case's first failing input set on one ONNX Runtime provider (tconform
    check's machinery, against the case's float64 reference module); the verdict joins each
    failing result as a note."""
    from tconform.module_check.localise import localise_case

    failing = [r for r in results if r.status == "fail"]
    if not failing or runtime.consumes != "onnx":
        return []
    first = failing[0]
    input_set = next(s for s in sets if s.name == first.input_set)
    tol = tolerance_for(first.precision, model.case.tolerance)
    feeds = {
        k: v.astype(np.float16) if model.io_type == "float16" and v.dtype == np.float32 else v
        for k, v in input_set.inputs.items()
    }
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


def verify_runtimes(options: VerifyOptions, graph_opt: str = "all") -> list[Runtime]:
    """Every requested runtime on every requested provider it supports (ONNX Runtime at the
    graph-optimisation level `graph_opt`)."""
    return make_runtimes(options.runtimes.replace(graph_opt=graph_opt))


@dataclass(frozen=True)
class Lane:
    """One case on one runtime in one cell: its input sets are work units."""

    case: Case
    cell: str  # Cell.key, MODULE or GIVEN
    runtime: Runtime
    export: Cell | None  # the export this lane runs (None: a PyTorch module or a given model)
    not_applicable: str = ""  # why this cell cannot exist; its units are listed, not run

    @property
    def model_key(self) -> tuple[str, str]:
        """Which model file the lane runs: the case's, in its export cell (or the given one)."""
        return self.case.name, self.export.export_key if self.export else GIVEN

    def units(self, set_names: list[str]) -> list[Unit]:
        size = self.case.tolerance
        if self.export is not None:
            group = f"{self.case.name}@{self.export.export_key}"
            shared = self.export.export_seconds(size)
        else:
            group, shared = f"{self.case.name}@{self.cell}", MODULE_SECONDS
        if self.not_applicable:  # listed with its reason, nothing exported or run
            shared = 0.0
        cost = 0.0 if self.not_applicable else RUN_SECONDS[size]
        return [
            Unit(self.case.name, self.cell, label(self.runtime), s, group, cost, shared)
            for s in set_names
        ]


def matrix_cells(options: VerifyOptions) -> list[Cell]:
    """The cross product of the requested axes, in the order they were given."""
    return [
        Cell(exporter, opset, dtype, graph_opt)
        for exporter in options.exporters
        for opset in options.opsets
        for dtype in options.dtypes
        for graph_opt in options.graph_opts
    ]


def _not_applicable(cell: Cell, cfg: ModelConfig, seed: int) -> str:
    """Why `cell` cannot be exported ('' when it can): ExportSettings holds the rules."""
    try:
        ExportSettings(cfg, seed, cell.exporter, cell.opset, cell.dtype)
    except UsageError as exc:
        return str(exc)
    return ""


def plan_lanes(
    options: VerifyOptions, cases: tuple[Case, ...], cfg: ModelConfig, seed: int
) -> list[Lane]:
    """Every lane of the run, case by case: the ONNX runtimes once per cell (a plain run has
    one cell, the artifacts folder's settings; a given model has its own), then the PyTorch
    runtimes once per case."""
    if options.matrix:
        cells = matrix_cells(options)
    else:
        settings = _artifact_settings(options, cfg, seed)
        cells = [Cell(settings.exporter, settings.opset, settings.dtype, options.graph_opts[0])]
    by_level = {level: verify_runtimes(options, level) for level in {c.graph_opt for c in cells}}
    first = by_level[cells[0].graph_opt]
    lanes = []
    for case in cases:
        if case.name in options.models:
            lanes += [Lane(case, GIVEN, r, None) for r in first if r.consumes == "onnx"]
        else:
            lanes += [
                lane for cell in cells for lane in _cell_lanes(case, cell, by_level, cfg, seed)
            ]
        lanes += [Lane(case, MODULE, r, None) for r in first if r.consumes == "module"]
    return lanes


def _cell_lanes(case: Case, cell: Cell, by_level, cfg: ModelConfig, seed: int) -> list[Lane]:
    """The ONNX runtimes' lanes of one case in one cell, with the reason where it cannot be."""
    reason = _not_applicable(cell, cfg, seed)
    default_level = VerifyOptions.graph_opts[0]
    lanes = []
    for runtime in by_level[cell.graph_opt]:
        if runtime.consumes != "onnx":
            continue
        why = reason
        levels = "graph_opt" in {f.name for f in dataclass_fields(runtime)}
        if not why and not levels and cell.graph_opt != default_level:
            why = f"{label(runtime)} has no graph-optimisation levels (it runs at {default_level})"
        lanes.append(Lane(case, cell.key, runtime, cell, why))
    return lanes


def plan_units(lanes: list[Lane], manifest: dict, with_doc: bool) -> list[Unit]:
    """Every work unit of the run, in run order (the documents' checks are one unit)."""
    units = [
        u for lane in lanes for u in lane.units(list(manifest["cases"][lane.case.name]["sets"]))
    ]
    if with_doc:
        units.append(documents_unit())
    return units


def result_unit(result: Result) -> str:
    """The id of the unit a result belongs to."""
    return documents_unit().id if result.case.startswith("doc:") else result.unit


def _selected(options: VerifyOptions, units: list[Unit]) -> list[Unit]:
    """The units this run checks: a shard of them, or the ones named (the pytest plugin)."""
    chosen = units
    if options.shard is not None:
        index, count = options.shard
        chosen = shard_units(units, index, count)
        if not chosen:
            groups = len({u.group for u in units})
            raise UsageError(
                f"--shard {index}/{count} holds no units: this run has {groups} groups of units "
                f"that share an export; use at most {groups} shards"
            )
    if options.only_units is not None:
        unknown = sorted(options.only_units - {u.id for u in units})
        if unknown:
            raise UsageError(f"no such unit in this run: {unknown[0]}")
        chosen = [u for u in chosen if u.id in options.only_units]
    return chosen


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


def _matrix_models(
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


@dataclass
class Plan:
    """What a run checks, before --shard or a unit filter: read from the golden manifest alone
    (nothing is exported or run)."""

    manifest: dict
    cfg: ModelConfig
    seed: int
    cases: tuple[Case, ...]
    lanes: list[Lane]
    units: list[Unit]

    def units_of(self, lane: Lane) -> list[Unit]:
        return lane.units(list(self.manifest["cases"][lane.case.name]["sets"]))


def plan(options: VerifyOptions) -> Plan:
    manifest = golden.read_manifest(options.golden_dir)
    cfg, seed = golden.manifest_config(manifest), int(manifest["seed"])
    cases = select_cases(options, manifest, options.golden_dir)
    for case in cases:  # a case with no input sets would have no units: nothing checked
        if not manifest["cases"][case.name]["sets"]:
            raise UsageError(
                f"{options.golden_dir / golden.MANIFEST}: case {case.name!r} has no input sets: "
                "nothing to check"
            )
    lanes = plan_lanes(options, cases, cfg, seed)
    units = plan_units(lanes, manifest, options.with_doc and options.export)
    return Plan(manifest, cfg, seed, cases, lanes, units)


def _verify_locked(
    options: VerifyOptions, report: RunReport, progress: Progress, locks: ExitStack
) -> None:
    planned = plan(options)
    manifest, cfg, seed, cases = planned.manifest, planned.cfg, planned.seed, planned.cases
    lanes, units = planned.lanes, planned.units
    with_doc = options.with_doc and options.export
    mine = _selected(options, units)
    mine_ids = {u.id for u in mine}
    lanes = [lane for lane in lanes if any(u.id in mine_ids for u in planned.units_of(lane))]
    with_doc = with_doc and documents_unit().id in mine_ids
    settings = None if options.matrix else _artifact_settings(options, cfg, seed)
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
    if options.with_doc and not options.export:
        progress("document checks: not run (--no-export exports nothing; `tconform doc` runs them)")
    if options.models and not options.export:
        progress("--model wins over the artifacts folder for: " + ", ".join(options.models))
    if options.shard:
        progress(f"shard {options.shard[0]}/{options.shard[1]}: {len(mine)} of {len(units)} units")
    # The document checks' models join the same pool of export processes.
    doc_jobs = doc.required_exports(options.artifacts_dir) if with_doc else []
    if options.matrix:
        models, doc_records = _matrix_models(options, lanes, cfg, seed, doc_jobs, progress)
    else:
        onnx_cases = tuple(
            dict.fromkeys(lane.case for lane in lanes if lane.runtime.consumes == "onnx")
        )
        by_case, doc_records = models_under_test(options, onnx_cases, settings, doc_jobs, progress)
        models = {
            lane.model_key: by_case[lane.case.name] for lane in lanes if lane.case.name in by_case
        }
    if options.artifacts_dir.is_dir():
        locks.enter_context(folder_lock(options.artifacts_dir, shared=True))
    localisations: list[Localisation] = []
    run_cases = list(dict.fromkeys(lane.case for lane in lanes))
    for n, case in enumerate(run_cases, 1):
        progress(f"[{n}/{len(run_cases)}] {case.name}")
        sets = golden.read_case(options.golden_dir, manifest, case, cfg)
        params = case.make_params(cfg, seed)
        for lane in (lane for lane in lanes if lane.case == case):
            lane_sets = [
                s
                for s in sets
                if unit_id(case.name, lane.cell, label(lane.runtime), s.name) in mine_ids
            ]
            results = _lane_results(lane, models, params, cfg, lane_sets, options)
            if options.localise and lane.runtime.consumes == "onnx" and not lane.not_applicable:
                model = models[lane.model_key]
                localisations += _localise_failures(lane.runtime, model, results, sets, cfg, seed)
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


def _lane_results(lane: Lane, models, params, cfg: ModelConfig, sets, options) -> list[Result]:
    """The lane's results on `sets`, each stamped with its cell and unit."""
    case, runtime = lane.case, lane.runtime
    if lane.not_applicable:
        # Named at the precision the cell would have run at, like its neighbours in the pivot.
        float16 = lane.export is not None and lane.export.dtype == "float16"
        precision = "float16" if float16 else runtime.precision
        results = [
            Result(
                case.name,
                case.component,
                runtime.name,
                runtime.ep,
                [],
                s.name,
                "skip",
                f"not applicable: {lane.not_applicable}",
                precision=precision,
            )
            for s in sets
        ]
    else:
        model = models[lane.model_key] if runtime.consumes == "onnx" else None
        subject = Subject(model, case_module(case, cfg, params))
        row = Result.about(case.name, case.component)
        results = execute(runtime, subject, sets, _judge(case), row, options.strict_placement)
    for r in results:
        r.cell = lane.cell
        r.unit = unit_id(case.name, lane.cell, label(runtime), r.input_set)
    return results

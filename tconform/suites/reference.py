"""tconform's own cases as a suite: the registry's cases against the goldens of a golden folder.

Which model stands for a case:
  --model CASE=PATH   the given file, read-only, whatever the artifacts folder holds;
  --no-export         whatever the artifacts folder holds, as it is (nothing is exported);
  otherwise           tconform's own export in the artifacts folder, exported where missing or
                      stale (only tconform's own unchanged files are ever replaced); a `--matrix`
                      run exports each (case, export cell) once into
                      artifacts/matrix/<exporter>-opset<N>-<dtype>/.
The documents' checks are one more unit of the run, their models exported in the same pool.
The golden folder is read under a shared lock (a `golden --force` waits); the artifacts folder
is locked exclusively while models are exported, shared while they run.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

from tconform import doc, golden, registry
from tconform.compare import judge_outputs, tolerance_for
from tconform.config import PLANNED_DTYPES
from tconform.errors import UsageError, first_line
from tconform.execution import Judge, case_module
from tconform.export import (
    ExportJob,
    ExportSettings,
    cache_key,
    default_opset,
    export_jobs,
    folder_settings,
    read_artifacts_manifest,
)
from tconform.files import sha256_file
from tconform.folders import folder_lock
from tconform.localise import Localisation
from tconform.localise.registry_case import localise_case
from tconform.models import ModelUnderTest, given_model, held_model, model_from_record
from tconform.plan import Lane, Progress, Suite, matrix_cells
from tconform.registry import Case
from tconform.request import Axes, References, Request
from tconform.results import Result
from tconform.runtimes import ModuleTarget, Runtime
from tconform.units import Cell, Unit, documents_unit

MATRIX_FOLDER = "matrix"  # artifacts/matrix/<export cell>/: one folder per exporter, opset, dtype


def cases_to_check(subject: References, manifest: dict) -> tuple[Case, ...]:
    """The cases to check. Named ones (--case, --model) must all have goldens; a plain run
    checks every registry case, so a golden folder missing one is an error, not a smaller pass."""
    named = (*subject.cases, *subject.models)
    if named:
        cases = registry.select_cases(named)
        for case in cases:
            if case.name not in manifest["cases"]:
                raise UsageError(f"{subject.golden_dir}: no goldens for case {case.name!r}")
        return cases
    missing = [name for name in registry.case_names() if name not in manifest["cases"]]
    if missing:
        raise UsageError(
            f"{subject.golden_dir}: no goldens for case {missing[0]!r} (a plain verify checks "
            "every case; name the ones this folder holds with --case)"
        )
    return registry.CASES


class ReferenceSuite(Suite):
    """The registry's cases named by `request` (all of them by default), on the goldens of its
    golden folder. Open it with `reference_suite`, which holds the folders' locks."""

    def __init__(self, request: Request, locks: ExitStack) -> None:
        subject = request.subject
        assert isinstance(subject, References)
        if request.axes.matrix and (subject.models or not subject.export):
            raise UsageError(
                "--matrix exports its own models: it takes neither --model nor --no-export"
            )
        self.request, self.subject, self.locks = request, subject, locks
        self.manifest = golden.read_golden_manifest(subject.golden_dir)
        self.where = str(subject.golden_dir / golden.MANIFEST)
        self.cfg = golden.manifest_config(self.manifest)
        self.seed = int(self.manifest["seed"])
        self.preset = self.manifest.get("preset")  # the goldens' (a row measured for it)
        self.cases = cases_to_check(subject, self.manifest)
        self.with_doc = subject.with_doc and subject.export
        self.runs_doc = False  # whether this machine runs the documents' unit (see `models`)
        self.doc_records: list = []  # the document checks' models, exported with the lanes'

    # --- planning ---------------------------------------------------------------------------

    def settings_for_folder(self) -> ExportSettings:
        """Export settings for the artifacts folder: the folder's own (a float16 folder stays
        float16, a TorchScript folder TorchScript), or tconform's defaults for a new folder. An
        --attention kernel other than the folder's is refused: a folder holds one kernel's
        graphs."""
        subject = self.subject
        held = folder_settings(subject.artifacts_dir) or {}
        attention = subject.attention or str(held.get("attention", "plain"))
        if held and held["attention"] != attention:
            raise UsageError(
                f"{subject.artifacts_dir} holds {held['attention']}-attention models; verify "
                f"--attention {attention} with an --artifacts folder of its own"
            )
        return ExportSettings(
            self.cfg,
            self.seed,
            exporter=str(held.get("exporter", "dynamo")),
            opset=int(held["opset"]) if held.get("opset") else default_opset(attention),
            dtype=str(held.get("dtype", "float32")),
            attention=attention,
        )

    def cells(self, axes: Axes) -> list[Cell]:
        if axes.matrix:
            return matrix_cells(axes)
        settings = self.settings_for_folder()
        return [Cell(settings.exporter, settings.opset, settings.dtype, axes.graph_opts[0])]

    def not_applicable(self, cell: Cell) -> str:
        if cell.dtype in PLANNED_DTYPES:
            return (
                f"{cell.dtype}: a precision plan is made for a user's module (tconform check), "
                "from its float64 copy's run; tconform's own cases have none"
            )
        try:  # ExportSettings holds the rules
            ExportSettings(self.cfg, self.seed, cell.exporter, cell.opset, cell.dtype)
        except UsageError as exc:
            return str(exc)
        return ""

    def given(self, case: Case) -> bool:
        return case.name in self.subject.models

    def set_names(self, case: Case) -> list[str]:
        return list(self.manifest["cases"][case.name]["sets"])

    def extra_units(self) -> list[Unit]:
        return [documents_unit()] if self.with_doc else []

    # --- models -----------------------------------------------------------------------------

    def require_inputs(self, lanes: list[Lane]) -> None:
        """Every golden file of the lanes' cases, all of them, first."""
        cases = list(dict.fromkeys(lane.case for lane in lanes))
        golden.require_intact(self.subject.golden_dir, self.manifest, cases, self.cfg)

    def models(
        self, lanes: list[Lane], mine: set[str], progress: Progress
    ) -> dict[tuple[str, str], ModelUnderTest]:
        """The model of every ONNX lane (given ones checked first, before any slow export),
        settled in one pool of export processes with the document checks' models where this
        machine runs their unit (`mine`: the ids of the units it runs)."""
        subject = self.subject
        self.require_inputs(lanes)
        self.runs_doc = self.with_doc and documents_unit().id in mine
        if subject.with_doc and not subject.export:
            progress(
                "document checks: not run (--no-export exports nothing; `tconform doc` runs them)"
            )
        if subject.models and not subject.export:
            progress("--model wins over the artifacts folder for: " + ", ".join(subject.models))
        doc_jobs = doc.required_exports(subject.artifacts_dir) if self.runs_doc else []
        if self.request.axes.matrix:
            models, self.doc_records = self._matrix_models(lanes, doc_jobs, progress)
        else:
            models, self.doc_records = self._plain_models(lanes, doc_jobs, progress)
        if subject.artifacts_dir.is_dir():
            self.locks.enter_context(folder_lock(subject.artifacts_dir, shared=True))
        return models

    def _plain_models(self, lanes, doc_jobs, progress):
        settings = self.settings_for_folder()
        onnx_cases = tuple(
            dict.fromkeys(lane.case for lane in lanes if lane.runtime.consumes == "onnx")
        )
        subject = self.subject
        for name, path in subject.models.items():
            # realpath: a link loop is the given model's own error, named when it is read
            inside = Path(os.path.realpath(path)).is_relative_to(
                os.path.realpath(subject.artifacts_dir)
            )
            if subject.export and inside:
                raise UsageError(
                    f"--model {name}={path}: lies in the artifacts folder {subject.artifacts_dir}, "
                    "which this run exports into and may rewrite; give a copy outside it (the "
                    "model under test is only read), or --no-export"
                )
        chosen = {
            name: given_model(registry.get_case(name), self.cfg, path)
            for name, path in subject.models.items()
            if any(case.name == name for case in onnx_cases)
        }
        for name, model in chosen.items():
            progress(
                f"  {name}: the given model {model.path} (sha256 {model.provenance.sha256[:12]})"
            )
        rest = [case for case in onnx_cases if case.name not in chosen]
        records = []
        if not subject.export:
            manifest = read_artifacts_manifest(subject.artifacts_dir)
            for case in rest:
                key = cache_key(case, settings)
                chosen[case.name] = held_model(case, self.cfg, subject.artifacts_dir, manifest, key)
        else:
            jobs = [ExportJob(case, settings, subject.artifacts_dir) for case in rest]
            extra = f" + {len(doc_jobs)} for the document checks" if doc_jobs else ""
            if jobs or doc_jobs:  # every model given (--model): nothing to export, nothing to say
                progress(
                    f"models: {len(jobs)}{extra}, exported where not current, in "
                    f"{subject.artifacts_dir}"
                )
            records = _export(jobs + doc_jobs, progress)
            for case, record in zip(rest, records[: len(rest)], strict=True):
                chosen[case.name] = model_from_record(case, record)
            records = records[len(rest) :]
        models = {
            lane.model_key: chosen[lane.case.name] for lane in lanes if lane.case.name in chosen
        }
        return models, records

    def _matrix_models(self, lanes, doc_jobs, progress):
        """Each (case, export cell) the lanes need, exported once into
        artifacts/matrix/<export>/ (or reused there), and the document checks' models."""
        needed = {
            lane.model_key: lane
            for lane in lanes
            if lane.export is not None and not lane.not_applicable
        }
        jobs = [
            ExportJob(
                lane.case,
                ExportSettings(
                    self.cfg, self.seed, lane.export.exporter, lane.export.opset, lane.export.dtype
                ),
                self.subject.artifacts_dir / MATRIX_FOLDER / lane.export.export_key,
            )
            for lane in needed.values()
        ]
        progress(f"models: {len(jobs)} exports of the matrix, exported where not current")
        records = _export(jobs + doc_jobs, progress)
        models = {
            key: model_from_record(lane.case, record)
            for (key, lane), record in zip(needed.items(), records[: len(jobs)], strict=True)
        }
        return models, records[len(jobs) :]

    # --- running ----------------------------------------------------------------------------

    def input_sets(self, case: Case) -> list[golden.InputSet]:
        return golden.read_case(self.subject.golden_dir, self.manifest, case, self.cfg)

    def module_target(self, case: Case) -> ModuleTarget:
        return case_module(case, self.cfg, case.make_params(self.cfg, self.seed))

    def judge(self, case: Case) -> Judge:
        """Each output under the case's tolerance row at the run's precision (the goldens'
        preset's own row, where one was measured for it)."""
        preset = self.preset
        return judge_outputs(lambda precision, _: tolerance_for(precision, case.tolerance, preset))

    def localise(
        self, runtime: Runtime, model: ModelUnderTest, results: list[Result], sets
    ) -> list[Localisation]:
        """The case's first failing input set, localised against the case's float64 reference
        module; the verdict joins each failing result as a note."""
        failing = [r for r in results if r.status == "fail"]
        if not failing:
            return []
        first = failing[0]
        input_set = next(s for s in sets if s.name == first.input_set)
        tol = tolerance_for(first.precision, model.case.tolerance, self.preset)
        try:
            found = localise_case(
                model.case.name, model, dict(input_set.inputs), self.cfg, self.seed, runtime, tol
            )
        except Exception as exc:  # localisation explains a failure; it never replaces one
            for r in failing:
                r.notes.append(f"localisation could not run: {first_line(exc)}")
            return []
        for r in failing:
            r.notes.append(f"localisation ({input_set.name}): {found.verdict}")
            if found.first is not None:
                r.message += f"; first divergence: {found.first.label} ({found.first.cls})"
        return [found]

    def extra_results(self, progress: Progress) -> list[Result]:
        """The documents' checks, where this machine runs their unit."""
        if not self.runs_doc:
            return []
        progress("document checks")
        results = doc.verify_results(
            self.request.runtimes, self.subject.artifacts_dir, self.doc_records
        )
        for r in results:  # one unit for all of them (tconform.units.documents_unit)
            r.cell, r.unit = documents_unit().cell, documents_unit().id
        return results

    def settings(self) -> dict[str, object]:
        subject = self.subject
        settings = None if self.request.axes.matrix else self.settings_for_folder()
        axes = self.request.axes
        return {
            "golden": str(subject.golden_dir),
            "golden_manifest_sha256": sha256_file(subject.golden_dir / golden.MANIFEST),
            "artifacts": str(subject.artifacts_dir),
            "export": subject.export,
            "given_models": {name: str(path) for name, path in subject.models.items()},
            "document_checks": self.runs_doc,
            "cases": [case.name for case in self.cases],
            "preset": self.preset,
            "config": self.cfg.to_dict(),
            "seed": self.seed,
            # A matrix run: the axes; a plain run: the artifacts folder's one setting.
            "dtype": list(axes.dtypes) if settings is None else settings.dtype,
            "exporter": list(axes.exporters) if settings is None else settings.exporter,
            "opset": list(axes.opsets) if settings is None else settings.opset,
            "attention": None if settings is None else settings.attention,
        }


def _export(jobs: list[ExportJob], progress: Progress) -> list:
    return export_jobs(
        jobs, on_done=lambda r: progress(f"  {r.location}: {'reused' if r.cached else 'exported'}")
    )


@contextlib.contextmanager
def reference_suite(request: Request) -> Iterator[ReferenceSuite]:
    """The suite of `request`'s References, its golden folder read under a shared lock for the
    block (and its artifacts folder once its models are settled)."""
    with ExitStack() as locks:
        locks.enter_context(folder_lock(request.subject.golden_dir, shared=True))
        yield ReferenceSuite(request, locks)

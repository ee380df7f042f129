"""Run the documents' numbers through the components on every requested runtime: the exported
files on the ONNX runtimes, the reference modules on the PyTorch ones.

Each case's RuntimeCheck names a registry case and a config; the component is exported once per
config into artifacts/doc/<config_name>/ (export_cases caches it), opened on every requested
runtime (tconform.execution: the same opening, feeding and judging as verify), fed the
document's numbers and compared with the oracle's exact value under the tolerance row of the
case's class at the runtime's precision.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tconform import registry
from tconform.compare import OutputComparison, judge_outputs, tolerance_for
from tconform.config import ModelConfig
from tconform.doc.worked import RuntimeCheck
from tconform.errors import TconformError
from tconform.execution import NotRun, Opened, Subject, case_module, open_subject, run_judged
from tconform.export import (
    ExportJob,
    ExportRecord,
    ExportSettings,
    build_module,
    export_cases,
    require_new_or_artifacts,
)
from tconform.files import require_inside
from tconform.folders import DOC_AREA, require_artifacts_folder
from tconform.golden import InputSet
from tconform.models import model_from_record
from tconform.provenance import ModelProvenance, oracle_provenance
from tconform.results import Result
from tconform.runtimes import Runtime, RuntimeOptions, label, make_runtimes

DOC_ARTIFACTS = DOC_AREA  # subfolder of the artifacts dir
COMPONENT = "document check"


@dataclass
class RuntimeOutcome:
    status: str  # pass | fail | unavailable | skip | error
    max_abs_err: float | None = None
    message: str = ""
    providers: tuple[str, ...] = ()
    comparison: OutputComparison | None = None  # the output against the exact value
    placement: dict[str, int] = field(default_factory=dict)  # ONNX Runtime: provider -> nodes
    model: ModelProvenance | None = None  # what ran (None for the oracle)
    precision: str = "float32"  # what the run computed in

    def to_dict(self) -> dict[str, object]:
        return {"status": self.status, "max_abs_err": self.max_abs_err, "message": self.message}


def doc_runtimes(options: RuntimeOptions) -> dict[str, Runtime]:
    """The runtimes the documents' numbers go through, by label: verify's runtimes, with
    verify's options."""
    return {label(runtime): runtime for runtime in make_runtimes(options)}


class OpenedComponents:
    """The document checks' components: each (component, config, runtime) exported and opened
    once, and reused for every check; `close()` (or the with-block) releases every session."""

    def __init__(
        self,
        artifacts_dir: Path,
        records: list[ExportRecord] = (),
        runtimes: dict[str, Runtime] | None = None,
    ) -> None:
        require_artifacts_folder(artifacts_dir)  # its models go to DIR/doc/<config>/
        require_new_or_artifacts(artifacts_dir)
        self.artifacts_dir = artifacts_dir
        self.runtimes = runtimes if runtimes is not None else doc_runtimes(RuntimeOptions())
        # Models settled by the caller's export pool, keyed by their location: their origin
        # (exported in this run, or cached) is theirs, not that of a second, cached lookup.
        self._records: dict[str, ExportRecord] = {r.location: r for r in records}
        self._models: dict[tuple[str, str], Path] = {}
        self._opened: dict[tuple[str, str, str], Opened | NotRun] = {}
        self._params: dict[tuple[str, str], dict[str, np.ndarray]] = {}
        self._sessions = ExitStack()

    def __enter__(self) -> OpenedComponents:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._sessions.close()
        self._opened.clear()

    def export_job(self, case_name: str, cfg: ModelConfig, config_name: str) -> ExportJob:
        """The export that a check of `case_name` at `cfg` needs."""
        out_dir = self.artifacts_dir / DOC_ARTIFACTS / config_name
        require_inside(self.artifacts_dir, out_dir)  # never written through a symlink leading out
        return ExportJob(registry.get_case(case_name), ExportSettings(cfg), out_dir)

    def model_path(self, case_name: str, cfg: ModelConfig, config_name: str) -> Path:
        key = (case_name, config_name)
        if key not in self._models:
            job = self.export_job(case_name, cfg, config_name)
            path = job.out_dir / case_name / "model.onnx"
            if str(path) not in self._records:
                (record,) = export_cases([job.case], job.settings, job.out_dir)
                self._records[str(path)] = record
            self._models[key] = path
        return self._models[key]

    def precision(self, runtime: str) -> str:
        """The precision a runtime label computes in ("float64" for the oracle)."""
        return "float64" if runtime == "oracle" else self.runtimes[runtime].precision

    def provenance(
        self, runtime: str, case_name: str, cfg: ModelConfig, config_name: str
    ) -> ModelProvenance | None:
        """The model `runtime` (a label, or "oracle") ran for this check: the ONNX file, the
        torch module, or the oracle's function with its weights."""
        if runtime == "oracle":
            case = registry.get_case(case_name)
            return oracle_provenance(case.oracle, self.params(case_name, cfg))
        return self.opened(runtime, case_name, cfg, config_name).provenance

    def opened(self, runtime: str, case_name: str, cfg: ModelConfig, config_name: str) -> Opened:
        """The component open on the runtime labelled `runtime`; NotRun where it cannot be."""
        key = (runtime, case_name, config_name)
        if key not in self._opened:
            case = registry.get_case(case_name)
            on = self.runtimes[runtime]
            model = None
            if on.consumes == "onnx":
                record = self._records.get(str(self.model_path(case_name, cfg, config_name)))
                model = model_from_record(case, record)
            subject = Subject(model, case_module(case, cfg, self.params(case_name, cfg)))
            try:
                self._opened[key] = self._sessions.enter_context(open_subject(on, subject))
            except NotRun as why:
                self._opened[key] = why
        found = self._opened[key]
        if isinstance(found, NotRun):
            raise found
        return found

    def params(self, case_name: str, cfg: ModelConfig) -> dict[str, np.ndarray]:
        """The seeded weights the export and torch use (the oracle needs the same)."""
        key = (case_name, cfg.to_json())
        if key not in self._params:
            self._params[key] = build_module(registry.get_case(case_name), ExportSettings(cfg))[1]
        return self._params[key]

    def outputs(
        self, runtime: str, case_name: str, cfg: ModelConfig, config_name: str, feeds: dict
    ) -> list[np.ndarray]:
        """The case's outputs on `runtime`: "oracle" (float64) or a runtime's label."""
        if runtime == "oracle":
            case = registry.get_case(case_name)
            return list(registry.run_oracle(case, cfg, self.params(case_name, cfg), feeds))
        return list(self.opened(runtime, case_name, cfg, config_name).run(feeds).values())

    def run_check(self, runtime: str, check: RuntimeCheck) -> RuntimeOutcome:
        """A document case's RuntimeCheck on one runtime; an unusable provider is
        `unavailable` and a missing kernel `skip`, never a pass."""
        case = registry.get_case(check.case)
        expected = {case.outputs(check.cfg)[check.output].name: check.exact}
        judge = judge_outputs(lambda precision, _: tolerance_for(precision, case.tolerance))
        try:
            opened = self.opened(runtime, check.case, check.cfg, check.config_name)
            result = run_judged(
                opened,
                InputSet("document", check.feeds, expected),
                judge,
                Result.about(f"doc:{check.case}", COMPONENT),
            )
        except NotRun as why:
            return RuntimeOutcome(str(why.status), message=str(why))
        except TconformError as exc:
            return RuntimeOutcome("error", message=str(exc))
        comparison = result.outputs[0] if result.outputs else None
        return RuntimeOutcome(
            result.status,
            comparison.max_abs_err if comparison else None,
            result.message,
            tuple(result.ep_actual),
            comparison,
            result.placement,
            result.model,
            result.precision,
        )

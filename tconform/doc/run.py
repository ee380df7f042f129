"""Run the documents' numbers through the exported components and the torch reference.

Each case's RuntimeCheck names a registry case and a config; the component is exported once per
config into artifacts/doc/<config_name>/ (export_cases caches it), opened on every requested
ONNX Runtime provider and on torch float32, fed the document's numbers and compared with the
oracle's exact value under the float32 tolerance of the case's class.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tconform import registry
from tconform.compare import OutputComparison, compare_output, tolerance_for
from tconform.config import ModelConfig
from tconform.doc.cases import RuntimeCheck
from tconform.errors import ProviderUnavailable, TconformError
from tconform.export import ExportJob, ExportRecord, ExportSettings, build_module, export_cases
from tconform.folders import require_artifacts_folder
from tconform.provenance import ModelProvenance, module_provenance, oracle_provenance
from tconform.runtimes import Runtime, Subject, label, make_runtime, open_subject

DOC_ARTIFACTS = "doc"  # subfolder of the artifacts dir


@dataclass
class RuntimeOutcome:
    status: str  # pass | fail | unavailable | error
    max_abs_err: float | None = None
    message: str = ""
    providers: tuple[str, ...] = ()
    comparison: OutputComparison | None = None  # the output against the exact value
    placement: dict[str, int] = field(default_factory=dict)  # ONNX Runtime: provider -> nodes
    model: ModelProvenance | None = None  # what ran (None for the oracle)

    def to_dict(self) -> dict[str, object]:
        return {"status": self.status, "max_abs_err": self.max_abs_err, "message": self.message}


def doc_runtimes(eps: list[str], **options) -> dict[str, Runtime]:
    """The runtimes the documents' numbers go through, by label: ONNX Runtime on each provider
    (with verify's options: tf32, device_id, provider_options), then torch float32 on the CPU."""
    runtimes = [make_runtime("onnxruntime", ep, **options) for ep in eps]
    runtimes.append(make_runtime("torch", "cpu"))
    return {label(runtime): runtime for runtime in runtimes}


class ComponentRunner:
    """Opens each (component, config, runtime) once and reuses it for every check."""

    def __init__(
        self,
        artifacts_dir: Path,
        records: list[ExportRecord] = (),
        runtimes: dict[str, Runtime] | None = None,
    ) -> None:
        require_artifacts_folder(artifacts_dir)  # its models go to DIR/doc/<config>/
        self.artifacts_dir = artifacts_dir
        self.runtimes = runtimes if runtimes is not None else doc_runtimes(["cpu"])
        # Models settled by the caller's export pool, keyed by their location: their origin
        # (exported in this run, or cached) is theirs, not that of a second, cached lookup.
        self._records: dict[str, ExportRecord] = {r.location: r for r in records}
        self._models: dict[tuple[str, str], Path] = {}
        self._sessions: dict[tuple[str, str, str], object] = {}
        self._params: dict[tuple[str, str], dict[str, np.ndarray]] = {}

    def export_job(self, case_name: str, cfg: ModelConfig, config_name: str) -> ExportJob:
        """The export that a check of `case_name` at `cfg` needs."""
        out_dir = self.artifacts_dir / DOC_ARTIFACTS / config_name
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
        if self.runtimes[runtime].consumes == "module":
            return module_provenance(self.session(runtime, case_name, cfg, config_name).module)
        return self._records[str(self.model_path(case_name, cfg, config_name))].provenance()

    def session(self, runtime: str, case_name: str, cfg: ModelConfig, config_name: str):
        """A session of the component on the runtime labelled `runtime`; raises
        ProviderUnavailable."""
        key = (runtime, case_name, config_name)
        if key not in self._sessions:
            case = registry.get_case(case_name)
            opened = self.runtimes[runtime]
            subject = Subject(
                self.model_path(case_name, cfg, config_name) if opened.consumes == "onnx" else None,
                case.module_target(cfg, self.params(case_name, cfg)),
            )
            self._sessions[key] = open_subject(opened, subject)
        return self._sessions[key]

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
        return self.session(runtime, case_name, cfg, config_name).run(feeds)

    def compare(
        self,
        runtime: str,
        case_name: str,
        cfg: ModelConfig,
        config_name: str,
        feeds: dict[str, np.ndarray],
        output: int,
        exact: np.ndarray,
    ) -> RuntimeOutcome:
        """Run one check; an unusable provider is `unavailable`, never a pass."""
        tolerance = tolerance_for(self.precision(runtime), registry.get_case(case_name).tolerance)
        try:
            session = self.session(runtime, case_name, cfg, config_name)
            actual = session.run(feeds)[output]
        except ProviderUnavailable as exc:
            return RuntimeOutcome("unavailable", message=str(exc))
        except TconformError as exc:
            return RuntimeOutcome("error", message=str(exc))
        result = compare_output(case_name, np.asarray(actual), exact, tolerance)
        placement = dict(getattr(session, "placement", {}))  # torch sessions have none
        return RuntimeOutcome(
            result.status,
            result.max_abs_err,
            result.message,
            tuple(session.providers),
            result,
            placement,
            self.provenance(runtime, case_name, cfg, config_name),
        )

    def run_check(self, runtime: str, check: RuntimeCheck) -> RuntimeOutcome:
        """A document case's RuntimeCheck on one runtime."""
        return self.compare(
            runtime,
            check.case,
            check.cfg,
            check.config_name,
            check.feeds,
            check.output,
            check.exact,
        )

"""All the document checks in one run: the cases on every runtime, the properties, and the
Results that `tconform doc` and `tconform verify` report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tconform.compare import OutputComparison
from tconform.doc.checks import (
    MEASUREMENTS,
    PROPERTY_CONFIG,
    PROPERTY_CONFIG_NAME,
    PropertyOutcome,
    property_outcomes,
)
from tconform.doc.run import COMPONENT, OpenedComponents, RuntimeOutcome, doc_runtimes
from tconform.doc.worked import DocCase, document_cases
from tconform.export import ExportJob, ExportRecord, export_jobs
from tconform.results import Result
from tconform.runtimes import Runtime, RuntimeOptions


@dataclass
class DocReport:
    runtimes: dict[str, Runtime]  # label -> runtime
    cases: list[DocCase]
    case_runtimes: dict[str, dict[str, RuntimeOutcome]] = field(default_factory=dict)
    properties: list[PropertyOutcome] = field(default_factory=list)
    runtime_settings: dict[str, dict] = field(default_factory=dict)  # label -> its settings()

    @property
    def runtime_failures(self) -> int:
        """Runs that disagree with the oracle beyond tolerance (or broke)."""
        bad = ("fail", "error", "crash")
        in_cases = sum(o.status in bad for r in self.case_runtimes.values() for o in r.values())
        return in_cases + sum(p.status in bad for p in self.properties)

    def to_dict(self) -> dict[str, object]:
        return {
            "runtimes": list(self.runtimes),
            "cases": [
                {
                    **case.to_dict(),
                    "runtimes": {
                        name: outcome.to_dict()
                        for name, outcome in self.case_runtimes.get(case.id, {}).items()
                    },
                }
                for case in self.cases
            ],
            "properties": [p.to_dict() for p in self.properties],
        }


def required_exports(artifacts_dir: Path) -> list[ExportJob]:
    """Every model the document checks run: the components fed the documents' numbers, at
    each document's dimensions, and the components the properties run, under
    artifacts_dir/doc/<config>/. Callers export them together with their own models."""
    components = OpenedComponents(artifacts_dir)
    checks = [case.runtime for case in document_cases() if case.runtime is not None]
    jobs = [components.export_job(c.case, c.cfg, c.config_name) for c in checks]
    jobs += [
        components.export_job(name, PROPERTY_CONFIG, PROPERTY_CONFIG_NAME)
        for m in MEASUREMENTS
        for name in m.cases
    ]
    unique = {(job.case.name, job.out_dir): job for job in jobs}
    return list(unique.values())


def run_document_checks(
    options: RuntimeOptions,
    artifacts_dir: Path,
    progress: Callable[[str], None] = lambda _: None,
    records: list[ExportRecord] | None = None,
) -> DocReport:
    """Evaluate every document case, run the ones with numbers for a component on every
    runtime of `options` (exports cached under artifacts_dir/doc/), and check every stated
    property. `records`: the document models, when the caller has exported them already."""
    runtimes = doc_runtimes(options)
    if records is None:
        jobs = required_exports(artifacts_dir)
        progress(
            f"document checks: {len(jobs)} models (cached where current) in {artifacts_dir}/doc"
        )
        records = export_jobs(jobs)
    report = DocReport(runtimes, document_cases())
    with OpenedComponents(artifacts_dir, records, runtimes) as components:
        for case in report.cases:
            if case.runtime is not None:
                report.case_runtimes[case.id] = {
                    name: components.run_check(name, case.runtime) for name in runtimes
                }
        report.properties = property_outcomes(components, list(runtimes))
        # read while their workers run: a worker's runtime says its release and environment
        report.runtime_settings = {name: rt.settings() for name, rt in runtimes.items()}
    return report


def _describe(report: DocReport, name: str) -> tuple[str, str, str]:
    """(runtime, ep, precision) of a label, or of the oracle."""
    if name == "oracle":
        return "oracle", "cpu", "float64"
    runtime = report.runtimes[name]
    return runtime.name, runtime.ep, runtime.precision


def report_results(report: DocReport) -> list[Result]:
    """One Result per (doc case, runtime) and per (property, runtime)."""
    results = []
    for case in report.cases:
        verdict_line = f"{case.verdict}: {case.quantity} ({case.source}, {case.section})"
        # The oracle computed the exact value; the verdict is about the document, not a failure.
        results.append(
            Result(
                f"doc:{case.id}",
                COMPONENT,
                "oracle",
                "cpu",
                ["numpy-float64"],
                f"document: {case.verdict}",
                "pass",
                verdict_line,
                "float64",
            )
        )
        for name, outcome in report.case_runtimes.get(case.id, {}).items():
            runtime, ep, _ = _describe(report, name)
            results.append(
                Result(
                    f"doc:{case.id}",
                    COMPONENT,
                    runtime,
                    ep,
                    list(outcome.providers),
                    "document",
                    outcome.status,
                    outcome.message or f"max abs err {outcome.max_abs_err:.3g} vs exact",
                    precision=outcome.precision,
                    outputs=[outcome.comparison] if outcome.comparison else [],
                    placement=outcome.placement,
                    model=outcome.model,
                )
            )
    for prop in report.properties:
        runtime, ep, precision = _describe(report, prop.runtime)
        message = (
            prop.message
            or f"{prop.statement}: worst violation {prop.violation:.3g} (limit {prop.limit:g})"
        )
        results.append(
            Result(
                f"doc:property-{prop.id}",
                COMPONENT,
                runtime,
                ep,
                [],
                "property",
                prop.status,
                message,
                precision,
                outputs=_violation(prop),
                model=prop.models[0] if prop.models else None,
                notes=[f"also ran {m.short}" for m in prop.models[1:]],
            )
        )
    return results


def _violation(prop: PropertyOutcome) -> list[OutputComparison]:
    """A property's worst violation as an output comparison against its limit (an atol)."""
    if prop.violation is None or prop.limit is None:
        return []
    kind = "ok" if prop.status == "pass" else "values"
    used = prop.violation / prop.limit
    return [
        OutputComparison(
            prop.id, [], prop.status, kind, prop.limit, 0.0, prop.violation, tolerance_used=used
        )
    ]


def verify_results(
    options: RuntimeOptions, artifacts_dir: Path, records: list[ExportRecord] | None = None
) -> list[Result]:
    """For `tconform verify`: every document case and property as Results."""
    return report_results(run_document_checks(options, artifacts_dir, records=records))

"""Sensitivity: how far past the tolerance line each fault of `tconform.fault_catalogue` lands.

For each fault and case: export the case as the golden folder's config and seed describe, inject
the fault, run the faulty file with ONNX Runtime (CPU) on every golden input set and compare each
output with its golden under the case's float32 tolerance row. The worst share of tolerance used
(|err| / (atol + rtol·|golden|), 1 = the line) says by how much a fault is caught, or by how
little it is missed. scripts/sensitivity.py prints the table that docs/sensitivity.md keeps.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from tconform import golden, registry
from tconform.compare import judge_outputs, tolerance_for
from tconform.execution import Subject, execute
from tconform.export import ExportJob, ExportSettings, export_jobs
from tconform.fault_catalogue import DETECTABLE, FAULTS, MARGIN_FACTOR, MARGINAL, Fault
from tconform.files import atomic_write_bytes
from tconform.golden import InputSet
from tconform.models import derived_file
from tconform.registry import Case
from tconform.results import Result, Status
from tconform.runtimes import make_runtime


@dataclass
class Check:
    """One model file against one case's goldens."""

    status: Status  # pass, fail, or error (ONNX Runtime raised while running it)
    tolerance_used: float  # worst over sets and outputs; inf: NaN/inf where the golden is finite
    message: str = ""  # the first failure
    per_set: dict[str, float] = field(default_factory=dict)


def _used(comparison) -> float:
    if comparison.kind in ("nonfinite", "shape", "dtype") or comparison.tolerance_used is None:
        return math.inf
    return comparison.tolerance_used


def check_model(model_path: Path, case: Case, sets: list[InputSet]) -> Check:
    """Run `model_path` as `case` on ONNX Runtime's CPU provider on every input set
    (tconform.execution, as verify runs it)."""
    judge = judge_outputs(lambda precision, _: tolerance_for(precision, case.tolerance))
    results = execute(
        make_runtime("onnxruntime"),
        Subject(derived_file(model_path)),
        sets,
        judge,
        Result.about(case.name, case.component),
    )
    check = Check(Status.PASS, 0.0)
    for result in results:
        if result.status == Status.ERROR:
            check.per_set[result.input_set] = math.inf
        else:
            check.per_set[result.input_set] = max((_used(c) for c in result.outputs), default=0.0)
        if result.status != Status.PASS and check.status == Status.PASS:
            check.status = Status(result.status)
            check.message = f"{result.input_set}: {result.message}"
    check.tolerance_used = max(check.per_set.values(), default=0.0)
    return check


@dataclass
class Measurement:
    fault: Fault
    case: str
    check: Check
    clean: Check  # the same case's unmodified export, for the headroom it starts from

    @property
    def expected(self) -> str:
        return self.fault.expectation(self.case)

    @property
    def detected(self) -> bool:
        return self.check.status != Status.PASS

    @property
    def as_expected(self) -> bool:
        if self.expected == MARGINAL:
            return 1 / MARGIN_FACTOR <= self.check.tolerance_used <= MARGIN_FACTOR
        return self.detected == (self.expected == DETECTABLE)


def export_models(names: Iterable[str], golden_dir: Path, out_dir: Path) -> dict[str, Path]:
    """The named cases exported (dynamo, opset 18, float32) with the goldens' config and seed;
    the one place this module asks tconform.export for models."""
    manifest = golden.read_golden_manifest(golden_dir)
    settings = ExportSettings(golden.manifest_config(manifest), seed=int(manifest["seed"]))
    jobs = [ExportJob(registry.get_case(n), settings, out_dir) for n in names]
    return {r.case: Path(r.location) for r in export_jobs(jobs)}


def measure(
    golden_dir: Path,
    work_dir: Path,
    faults: Iterable[Fault] = FAULTS,
    progress: Callable[[Measurement], None] = lambda _: None,
) -> list[Measurement]:
    """Every fault on every case it applies to; faulty models are written under work_dir."""
    faults = list(faults)
    manifest = golden.read_golden_manifest(golden_dir)
    cfg = golden.manifest_config(manifest)
    wanted = {name for fault in faults for name in fault.cases}
    cases = [c for c in registry.CASES if c.name in wanted]
    models = export_models([c.name for c in cases], golden_dir, work_dir / "clean")
    sets = {c.name: golden.read_case(golden_dir, manifest, c, cfg) for c in cases}
    clean = {c.name: check_model(models[c.name], c, sets[c.name]) for c in cases}
    measurements = []
    for fault in faults:
        for name in fault.cases:
            case = registry.get_case(name)
            faulty = fault.inject(onnx.load(str(models[name])))
            path = work_dir / fault.name / f"{name}.onnx"
            atomic_write_bytes(path, faulty.SerializeToString())
            measurement = Measurement(fault, name, check_model(path, case, sets[name]), clean[name])
            measurements.append(measurement)
            progress(measurement)
    return measurements


def format_used(used: float) -> str:
    """A share of tolerance in multiples of it (1 = the line), or where a value was NaN or
    infinite although the golden is finite."""
    if math.isinf(used):
        return "NaN/inf"
    return f"{used:.3g}"


def markdown_table(measurements: list[Measurement]) -> str:
    rows = [
        "| fault | case | expected | worst tolerance used (1 = the line) | clean model | verdict |",
        "|---|---|---|---:|---:|---|",
    ]
    for m in measurements:
        verdict = "detected" if m.detected else "not detected"
        if not m.as_expected:
            verdict += " (**unexpected**)"
        rows.append(
            f"| {m.fault.name} | {m.case} | {m.expected} | "
            f"{format_used(m.check.tolerance_used)} | {format_used(m.clean.tolerance_used)} | "
            f"{verdict} |"
        )
    return "\n".join(rows) + "\n"

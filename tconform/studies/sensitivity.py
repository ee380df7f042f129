"""Sensitivity: how far past the tolerance line each fault of
`tconform.studies.fault_catalogue` lands.

For each fault and case: export the case as the golden folder's config and seed describe, inject
the fault, run the faulty file with ONNX Runtime (CPU) on every golden input set and compare each
output with its golden under the case's tolerance row. The worst share of tolerance used
(|err| / (atol + rtol·|golden|), 1 = the line) says by how much a fault is caught, or by how
little it is missed. scripts/sensitivity.py prints the table that docs/sensitivity.md keeps.

Under a reduced-precision dtype the fault is the same mistake in the model a user would have:
int8 and int4 inject it into the float32 export and quantise the faulty model with the dtype's
own settings (a mistake made before quantisation, carried by it); bfloat16 injects it into the
bfloat16 export. Each runs where its graph runs (bfloat16: OpenVINO, since ONNX Runtime's CPU
provider has no bfloat16 MatMul) and is judged by its own row.
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
from tconform.export import QUANTIZERS, ExportJob, ExportSettings, export_jobs
from tconform.files import atomic_write_bytes
from tconform.golden import InputSet
from tconform.models import derived_file
from tconform.registry import Case
from tconform.results import Result, Status
from tconform.runtimes import make_runtime
from tconform.studies.fault_catalogue import DETECTABLE, FAULTS, MARGIN_FACTOR, MARGINAL, Fault

# The runtime each dtype's models are checked on: ONNX Runtime's CPU provider, except where it
# has no kernels for the graph's type.
RUNTIME_FOR = {"bfloat16": "openvino"}


@dataclass
class Check:
    """One model file against one case's goldens."""

    status: Status  # pass, fail, or error (ONNX Runtime raised while running it)
    tolerance_used: float  # worst over sets and outputs; inf: NaN/inf where the golden is finite
    message: str = ""  # the first failure
    per_set: dict[str, float] = field(default_factory=dict)
    sqnr_db: float | None = None  # the lowest SQNR of any output on any set (None: exact)


def _used(comparison) -> float:
    if comparison.kind in ("nonfinite", "shape", "dtype") or comparison.tolerance_used is None:
        return math.inf
    return comparison.tolerance_used


def check_model(
    model_path: Path, case: Case, sets: list[InputSet], runtime: str = "onnxruntime"
) -> Check:
    """Run `model_path` as `case` on `runtime` (ONNX Runtime's CPU provider) on every input set
    (tconform.execution, as verify runs it), under the row of the precision it computes in."""
    judge = judge_outputs(lambda precision, _: tolerance_for(precision, case.tolerance))
    results = execute(
        make_runtime(runtime),
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
        for comparison in result.outputs:
            if comparison.kind in ("nonfinite", "shape", "dtype"):
                check.sqnr_db = -math.inf
            elif comparison.sqnr_db is not None:
                check.sqnr_db = min(check.sqnr_db or math.inf, comparison.sqnr_db)
    check.tolerance_used = max(check.per_set.values(), default=0.0)
    return check


@dataclass
class Measurement:
    fault: Fault
    case: str
    check: Check
    clean: Check  # the same case's unmodified export, for the headroom it starts from
    dtype: str = "float32"

    @property
    def expected(self) -> str:
        """What the catalogue expects under the float32 rows; under another dtype's row
        nothing is expected beforehand: what it catches is the measurement."""
        return self.fault.expectation(self.case) if self.dtype == "float32" else "-"

    @property
    def detected(self) -> bool:
        return self.check.status != Status.PASS

    @property
    def as_expected(self) -> bool:
        if self.dtype != "float32":
            return True
        if self.expected == MARGINAL:
            return 1 / MARGIN_FACTOR <= self.check.tolerance_used <= MARGIN_FACTOR
        return self.detected == (self.expected == DETECTABLE)


def export_models(
    names: Iterable[str], golden_dir: Path, out_dir: Path, dtype: str = "float32"
) -> dict[str, Path]:
    """The named cases exported (dynamo, opset 18, `dtype`) with the goldens' config and seed;
    the one place this module asks tconform.export for models."""
    manifest = golden.read_golden_manifest(golden_dir)
    settings = ExportSettings(
        golden.manifest_config(manifest), seed=int(manifest["seed"]), dtype=dtype
    )
    jobs = [ExportJob(registry.get_case(n), settings, out_dir) for n in names]
    return {r.case: Path(r.location) for r in export_jobs(jobs)}


def measure(
    golden_dir: Path,
    work_dir: Path,
    faults: Iterable[Fault] = FAULTS,
    progress: Callable[[Measurement], None] = lambda _: None,
    dtype: str = "float32",
) -> list[Measurement]:
    """Every fault on every case it applies to, in models of `dtype`; faulty models are
    written under work_dir."""
    faults = list(faults)
    manifest = golden.read_golden_manifest(golden_dir)
    cfg = golden.manifest_config(manifest)
    wanted = {name for fault in faults for name in fault.cases}
    cases = [c for c in registry.CASES if c.name in wanted]
    names = [c.name for c in cases]
    clean_models = export_models(names, golden_dir, work_dir / f"clean-{dtype}", dtype)
    # int8 and int4 faults go into the float32 graph, which is then quantised like the clean one
    injected = "float32" if dtype in QUANTIZERS else dtype
    models = export_models(names, golden_dir, work_dir / f"clean-{injected}", injected)
    runtime = RUNTIME_FOR.get(dtype, "onnxruntime")
    sets = {c.name: golden.read_case(golden_dir, manifest, c, cfg) for c in cases}
    clean = {c.name: check_model(clean_models[c.name], c, sets[c.name], runtime) for c in cases}
    measurements = []
    for fault in faults:
        for name in fault.cases:
            case = registry.get_case(name)
            faulty = fault.inject(onnx.load(str(models[name])))
            path = work_dir / fault.name / f"{name}-{dtype}.onnx"
            if dtype in QUANTIZERS:
                before = path.with_name(f"{name}-float32.onnx")
                atomic_write_bytes(before, faulty.SerializeToString())
                QUANTIZERS[dtype](before, path)
            else:
                atomic_write_bytes(path, faulty.SerializeToString())
            check = check_model(path, case, sets[name], runtime)
            measurement = Measurement(fault, name, check, clean[name], dtype)
            measurements.append(measurement)
            progress(measurement)
    return measurements


def format_used(used: float) -> str:
    """A share of tolerance in multiples of it (1 = the line), or where a value was NaN or
    infinite although the golden is finite."""
    if math.isinf(used):
        return "NaN/inf"
    return f"{used:.3g}"


def format_sqnr(sqnr: float | None) -> str:
    """The lowest SQNR in dB ('exact' where no output differs from its golden)."""
    if sqnr is None:
        return "exact"
    return "NaN/inf" if math.isinf(sqnr) else f"{sqnr:.1f}"


def markdown_table(measurements: list[Measurement]) -> str:
    """The float32 table (with the catalogue's expectations), or under a reduced-precision
    row the caught / let-through table with each model's lowest SQNR."""
    if any(m.dtype != "float32" for m in measurements):
        return _reduced_table(measurements)
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


def _reduced_table(measurements: list[Measurement]) -> str:
    rows = [
        "| fault | case | worst tolerance used (1 = the line) | clean model | lowest SQNR dB "
        "(clean) | verdict |",
        "|---|---|---:|---:|---:|---|",
    ]
    for m in measurements:
        verdict = "caught" if m.detected else "let through"
        rows.append(
            f"| {m.fault.name} | {m.case} | {format_used(m.check.tolerance_used)} | "
            f"{format_used(m.clean.tolerance_used)} | {format_sqnr(m.check.sqnr_db)} "
            f"({format_sqnr(m.clean.sqnr_db)}) | {verdict} |"
        )
    caught = sum(m.detected for m in measurements)
    rows.append("")
    rows.append(f"{caught} of {len(measurements)} (fault, case) pairs caught.")
    return "\n".join(rows) + "\n"

"""A verify lane's results: its model (or module) on its runtime, every input set judged against
the goldens under the case's tolerance row (tconform.execution), each result stamped with its
cell and unit; with `--localise`, the first failing input set of an ONNX lane localised.
"""

from __future__ import annotations

from tconform.compare import judge_outputs, tolerance_for
from tconform.config import ModelConfig
from tconform.errors import first_line
from tconform.execution import Subject, case_module, execute
from tconform.localise import Localisation
from tconform.localise.cases import localise_case
from tconform.models import ModelUnderTest
from tconform.plan import Lane
from tconform.registry import Case
from tconform.results import Result
from tconform.runtimes import Runtime, label
from tconform.units import unit_id


def judge_case(case: Case, preset: str | None = None):
    """The goldens of `case`, each output under the case's tolerance row at the run's
    precision (the goldens' preset's own row, where one was measured for it)."""
    return judge_outputs(lambda precision, _: tolerance_for(precision, case.tolerance, preset))


def localise_failures(
    runtime: Runtime,
    model: ModelUnderTest,
    results: list[Result],
    sets,
    cfg,
    seed,
    preset: str | None = None,
) -> list[Localisation]:
    """Localise the case's first failing input set on one ONNX Runtime provider (tconform
    check's machinery, against the case's float64 reference module); the verdict joins each
    failing result as a note."""
    failing = [r for r in results if r.status == "fail"]
    if not failing or runtime.consumes != "onnx":
        return []
    first = failing[0]
    input_set = next(s for s in sets if s.name == first.input_set)
    tol = tolerance_for(first.precision, model.case.tolerance, preset)
    try:
        found = localise_case(
            model.case.name, model, dict(input_set.inputs), cfg, seed, runtime, tol
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


def lane_results(
    lane: Lane, models, params, cfg: ModelConfig, sets, options, preset: str | None = None
) -> list[Result]:
    """The lane's results on `sets`, each stamped with its cell and unit; judged by the rows of
    the goldens' `preset`."""
    case, runtime = lane.case, lane.runtime
    if lane.not_applicable:
        # Named at the precision the cell would have run at, like its neighbours in the pivot.
        narrow = lane.export is not None and lane.export.dtype != "float32"
        precision = lane.export.dtype if narrow else runtime.precision
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
        judge = judge_case(case, preset)
        results = execute(runtime, subject, sets, judge, row, options.strict_placement)
    for r in results:
        r.cell = lane.cell
        r.unit = unit_id(case.name, lane.cell, label(runtime), r.input_set)
    return results

"""The plan of a run: which lanes and work units it holds, and which of them this machine
checks (a shard, or the units the pytest plugin names).

Everything here is decided from the request and the suite alone (tconform.suites: tconform's
own cases against a golden folder, or a user's model against its float64 copy): nothing is
exported or run. A lane is one case on one runtime in one cell (how its model is made and run,
from tconform.units); its input sets are its work units. A plain run has one cell (the suite's
own settings, or a given model's); `--matrix` has one per exporter x opset x dtype x
graph-optimisation level, and a cell that cannot exist (an opset the exporter lacks, a level the
runtime lacks) keeps its lanes, listed with the reason and never run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from tconform.errors import EXIT_EP_UNAVAILABLE, TconformError, UsageError
from tconform.request import Axes, Request
from tconform.results import Result
from tconform.runtimes import ModuleTarget, Runtime, label, make_runtimes, takes_option
from tconform.units import (
    GIVEN,
    MODULE,
    MODULE_SECONDS,
    RUN_SECONDS,
    Cell,
    Unit,
    shard_units,
)

if TYPE_CHECKING:
    from tconform.execution import InputSet, Judge
    from tconform.localise import Localisation
    from tconform.models import ModelUnderTest

Progress = Callable[[str], None]


# --- the seam: where a run's cases come from ------------------------------------------------
# A suite answers, for its cases, everything the pipeline (tconform.pipeline) asks that depends
# on the subject: which cells a case's model exists in, the names of its input sets (enough to
# plan), the models of the lanes (exported, held or given), the input sets with their expected
# outputs, the module the PyTorch runtimes run, how outputs are judged, how a failure is
# localised, and what the report records of it. tconform.suites holds the two: tconform's own
# cases against a golden folder, and a user's model against its float64 copy.


class SuiteCase(Protocol):
    """What the pipeline reads of a case (tconform.registry.Case is one)."""

    name: str
    component: str
    tolerance: str  # its size: a row class of tconform.compare.TOLERANCES


class Suite:
    """A suite of cases. Subclasses give what every suite has; the methods with a body here
    are what a suite without documents' checks or given models leaves as it is."""

    where: str  # how messages name where its cases come from (a golden manifest, a factory)
    cases: tuple[SuiteCase, ...]

    def cells(self, axes: Axes) -> list[Cell]:
        """The cells the ONNX lanes run in (the one cell of a plain run, or the matrix)."""
        raise NotImplementedError

    def not_applicable(self, cell: Cell) -> str:
        """Why `cell` cannot exist for this suite ('' when it can)."""
        return ""

    def given(self, case: SuiteCase) -> bool:
        """Whether the case's model is a file the user named (the cell `given`)."""
        return False

    def module_runtimes(self, requested: list[Runtime]) -> list[Runtime]:
        """The runtimes that run the case's module (torch, torch.compile), of those requested."""
        return [r for r in requested if r.consumes == "module"]

    def row(self, case: SuiteCase) -> Result:
        """What every result of the case starts from (case, component, notes, reference)."""
        return Result.about(case.name, case.component)

    def set_names(self, case: SuiteCase) -> list[str]:
        """The names of the case's input sets, known before anything runs."""
        raise NotImplementedError

    def require_inputs(self, lanes: list) -> None:
        """What the lanes read, checked before anything runs (a usage error naming the file);
        `models` checks it first, and the pytest plugin at collection."""

    def models(
        self, lanes: list, mine: set[str], progress: Progress
    ) -> dict[tuple[str, str], ModelUnderTest]:
        """The model of every ONNX lane, by `Lane.model_key`: exported, held or given (`mine`:
        the ids of the units this machine runs, extra units among them)."""
        raise NotImplementedError

    def input_sets(self, case: SuiteCase) -> list[InputSet]:
        """The case's input sets, with the outputs expected of each."""
        raise NotImplementedError

    def module_target(self, case: SuiteCase) -> ModuleTarget:
        """The module the PyTorch runtimes run for the case."""
        raise NotImplementedError

    def judge(self, case: SuiteCase) -> Judge:
        """How the case's outputs are judged, at the precision each run computed in."""
        raise NotImplementedError

    def run(
        self, lane: Lane, models: dict, sets: list[InputSet], strict_placement: bool
    ) -> list[Result]:
        """The lane's results on `sets` (of `input_sets`): each set fed to the lane's model, or
        the case's module, and judged (tconform.execution). A suite whose cases are not one
        feed each (decoding) runs them its own way."""
        from tconform.execution import Subject, execute  # the plan itself runs nothing

        case, runtime = lane.case, lane.runtime
        if runtime.consumes == "onnx":
            subject = Subject(onnx=models[lane.model_key])
        else:
            subject = Subject(module=self.module_target(case))
        return execute(runtime, subject, sets, self.judge(case), self.row(case), strict_placement)

    def localise(
        self, runtime: Runtime, model: ModelUnderTest, results: list[Result], sets: list[InputSet]
    ) -> list[Localisation]:
        """Localise a lane's failure (or, where asked, every result); the verdicts join the
        results as notes."""
        return []

    def extra_units(self) -> list[Unit]:
        """Units of the suite's own beside the lanes' (the documents' checks)."""
        return []

    def extra_results(self, progress: Progress) -> list[Result]:
        """The results of the `extra_units` this machine runs (`models` was told which)."""
        return []

    def settings(self) -> dict[str, object]:
        """What the report records of the subject (after `models`)."""
        return {}


def request_runtimes(request: Request, graph_opt: str = "all") -> list[Runtime]:
    """Every requested runtime on every requested provider it supports (ONNX Runtime at the
    graph-optimisation level `graph_opt`)."""
    return make_runtimes(request.runtimes.given(graph_opt=graph_opt))


@dataclass(frozen=True)
class Lane:
    """One case on one runtime in one cell: its input sets are work units."""

    case: SuiteCase
    cell: str  # Cell.key, MODULE or GIVEN
    runtime: Runtime
    export: Cell | None  # the export this lane runs (None: a PyTorch module or a given model)
    not_applicable: str = ""  # why this cell cannot exist; its units are listed, not run

    @property
    def model_key(self) -> tuple[str, str]:
        """Which model file the lane runs: the case's, in its export cell (or the given one)."""
        return self.case.name, self.export.export_key if self.export else GIVEN

    @property
    def precision(self) -> str:
        """The precision the lane is named at before it runs (a cell that cannot exist, one
        whose model could not be made, one its process crashed in): its export's reduced
        dtype, else what its runtime computes in."""
        narrow = self.export is not None and self.export.dtype != "float32"
        return self.export.dtype if narrow else self.runtime.precision

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


def matrix_cells(axes: Axes) -> list[Cell]:
    """The cross product of the requested axes, in the order they were given."""
    return [
        Cell(exporter, opset, dtype, graph_opt)
        for exporter in axes.exporters
        for opset in axes.opsets
        for dtype in axes.dtypes
        for graph_opt in axes.graph_opts
    ]


def plan_lanes(request: Request, suite: Suite) -> list[Lane]:
    """Every lane of the run, case by case: the ONNX runtimes once per cell (a plain run has
    one cell, the suite's own settings; a given model has its own), then the PyTorch runtimes
    once per case."""
    cells = suite.cells(request.axes)
    levels = {cell.graph_opt for cell in cells}
    by_level = {level: request_runtimes(request, level) for level in levels}
    first = by_level[cells[0].graph_opt]
    lanes = []
    for case in suite.cases:
        if suite.given(case):  # the file as it is, at each graph-optimisation level asked for
            given = list(dict.fromkeys(cell.graph_opt for cell in cells))
            for level in given:
                key = GIVEN if len(given) == 1 else f"{GIVEN}-{level}"
                lanes += _level_lanes(case, key, None, level, by_level[level], "")
        else:
            for cell in cells:
                runtimes = by_level[cell.graph_opt]
                reason = suite.not_applicable(cell)
                lanes += _level_lanes(case, cell.key, cell, cell.graph_opt, runtimes, reason)
        lanes += [Lane(case, MODULE, r, None) for r in suite.module_runtimes(first)]
    return lanes


def _level_lanes(
    case: SuiteCase, key: str, cell: Cell | None, level: str, runtimes, reason: str
) -> list[Lane]:
    """The ONNX runtimes' lanes of one case in one cell (`key`; a given model's has no Cell)
    at graph-optimisation `level`, with the reason where it cannot be."""
    default_level = Axes.graph_opts[0]
    lanes = []
    for runtime in runtimes:
        if runtime.consumes != "onnx":
            continue
        why = reason
        levels = takes_option(runtime, "graph_opt")
        if not why and not levels and level != default_level:
            why = f"{label(runtime)} has no graph-optimisation levels (it runs at {default_level})"
        lanes.append(Lane(case, key, runtime, cell, why))
    return lanes


def select_units(request: Request, units: list[Unit]) -> list[Unit]:
    """The units this run checks: a shard of them, or the ones named (the pytest plugin)."""
    chosen = units
    if request.shard is not None:
        index, count = request.shard
        if not (isinstance(index, int) and isinstance(count, int) and 1 <= index <= count):
            raise UsageError(f"--shard {index}/{count}: K/N with 1 <= K <= N")
        chosen = shard_units(units, index, count)
        if not chosen:
            groups = len({u.group for u in units})
            raise UsageError(
                f"--shard {index}/{count} holds no units: this run has {groups} groups of units "
                f"that share an export; use at most {groups} shards"
            )
    if request.only_units is not None:
        unknown = sorted(request.only_units - {u.id for u in units})
        if unknown:
            raise UsageError(f"no such unit in this run: {unknown[0]}")
        chosen = [u for u in chosen if u.id in request.only_units]
    return chosen


@dataclass
class Plan:
    """What a run checks, before --shard or a unit filter (nothing is exported or run)."""

    suite: Suite
    lanes: list[Lane]
    units: list[Unit]

    def units_of(self, lane: Lane) -> list[Unit]:
        return lane.units(self.suite.set_names(lane.case))


def plan(request: Request, suite: Suite) -> Plan:
    """The run's plan; a run none of whose ONNX lanes can exist (every `--matrix` cell not
    applicable) checks no model and ends here with exit 3, naming why."""
    for case in suite.cases:  # a case with no input sets would have no units: nothing checked
        if not suite.set_names(case):
            raise UsageError(
                f"{suite.where}: case {case.name!r} has no input sets: nothing to check"
            )
    lanes = plan_lanes(request, suite)
    onnx = [lane for lane in lanes if lane.runtime.consumes == "onnx"]
    if onnx and all(lane.not_applicable for lane in onnx):
        reasons = "; ".join(dict.fromkeys(f"{lane.cell}: {lane.not_applicable}" for lane in onnx))
        raise TconformError.with_code(
            f"nothing to check: no ONNX lane of this run can exist ({reasons})",
            EXIT_EP_UNAVAILABLE,
        )
    units = [u for lane in lanes for u in lane.units(suite.set_names(lane.case))]
    return Plan(suite, lanes, units + suite.extra_units())

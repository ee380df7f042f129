"""The plan of a verify run: which cases, lanes, cells and work units it holds, and which of
them this machine checks (a shard, or the units the pytest plugin names).

Everything here is decided from the options and the golden manifest alone: nothing is exported
or run. A lane is one case on one runtime in one cell (how its model is made and run, from
tconform.units); its golden input sets are its work units. A plain run has one cell (the
artifacts folder's settings, or the given model's); `--matrix` has one per exporter x opset x
dtype x graph-optimisation level, and a cell that cannot exist (an opset the exporter lacks, a
level the runtime lacks) keeps its lanes, listed with the reason and never run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from tconform import golden, registry
from tconform.config import ModelConfig
from tconform.errors import EXIT_EP_UNAVAILABLE, TconformError, UsageError
from tconform.export import (
    DEFAULT_OPSET,
    ExportSettings,
    default_opset,
    folder_settings,
)
from tconform.registry import Case
from tconform.runtimes import Runtime, RuntimeOptions, label, make_runtimes, takes_option
from tconform.units import (
    GIVEN,
    MODULE,
    MODULE_SECONDS,
    RUN_SECONDS,
    Cell,
    Unit,
    documents_unit,
    shard_units,
)


@dataclass
class VerifyOptions:
    """What a verify run is asked for: the command line's options, before any plan."""

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


def cases_to_check(options: VerifyOptions, manifest: dict, golden_dir: Path) -> tuple[Case, ...]:
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


def artifact_settings(options: VerifyOptions, cfg: ModelConfig, seed: int) -> ExportSettings:
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
        settings = artifact_settings(options, cfg, seed)
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
        levels = takes_option(runtime, "graph_opt")
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


def select_units(options: VerifyOptions, units: list[Unit]) -> list[Unit]:
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
    """The run's plan; a run none of whose ONNX lanes can exist (every `--matrix` cell not
    applicable) checks no model and ends here with exit 3, naming why."""
    manifest = golden.read_golden_manifest(options.golden_dir)
    cfg, seed = golden.manifest_config(manifest), int(manifest["seed"])
    cases = cases_to_check(options, manifest, options.golden_dir)
    for case in cases:  # a case with no input sets would have no units: nothing checked
        if not manifest["cases"][case.name]["sets"]:
            raise UsageError(
                f"{options.golden_dir / golden.MANIFEST}: case {case.name!r} has no input sets: "
                "nothing to check"
            )
    lanes = plan_lanes(options, cases, cfg, seed)
    onnx = [lane for lane in lanes if lane.runtime.consumes == "onnx"]
    if onnx and all(lane.not_applicable for lane in onnx):
        reasons = "; ".join(dict.fromkeys(f"{lane.cell}: {lane.not_applicable}" for lane in onnx))
        raise TconformError.with_code(
            f"nothing to check: no ONNX lane of this run can exist ({reasons})",
            EXIT_EP_UNAVAILABLE,
        )
    units = plan_units(lanes, manifest, options.with_doc and options.export)
    return Plan(manifest, cfg, seed, cases, lanes, units)

"""Work units: the smallest piece of a verify run that has a verdict of its own, and the
deterministic split of a run's units into shards for CI machines.

A unit is one case, in one cell, on one runtime, on one golden input set. A cell is how the
model was made and run: exporter, opset, dtype and ONNX Runtime graph-optimisation level (runtimes
that run the PyTorch module instead of an export share the cell `module`, a given model has the
cell `given`). Which units a run holds is decided by tconform.plan; this module is their
vocabulary, which report merge and the pivot view read too. Its id is a stable
string, the same on every machine, so that shard reports can be merged unit for unit.

Shards are balanced by an estimated cost. Exporting dominates (docs/scale.md), so the units that
share one exported model (or one PyTorch module) form a group and a group is never split: no
shard repeats another's export. Groups go, biggest first, to the shard with the least cost so far
(longest processing time first); ties go to the lower shard, so every machine computes the same
split. Importing this module is cheap (no torch, onnx or onnxruntime).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tconform.errors import EXIT_EP_UNAVAILABLE, TconformError
from tconform.results import Result, unchecked_lanes

MODULE = "module"  # the cell of runtimes that run the PyTorch module (torch, torch-compile)
GIVEN = "given"  # the cell of a model named with --model: how it was made is not ours to say
DOCUMENTS = "documents"  # the unit (and case name) of the documents' checks, one per run
SEPARATOR = "/"  # no case name, cell key, runtime label or input set name contains it

# Estimated seconds per export and per input set run, by the case's tolerance class (its size).
# Measured on the tiny preset (docs/scale.md); only their ratios matter for balancing.
EXPORT_SECONDS = {"component": 2.0, "layer": 4.0, "stack": 6.0, "model": 10.0}
RUN_SECONDS = {"component": 0.02, "layer": 0.04, "stack": 0.08, "model": 0.15}
# A TorchScript export costs about an eighth of a dynamo one (docs/scale.md: 0.4 vs 3.4 CPU-s
# per model); an exporter not listed is costed as dynamo.
EXPORTER_FACTOR = {"dynamo": 1.0, "torchscript": 0.12}
MODULE_SECONDS = 0.1  # building a reference module and its weights
DOCUMENTS_SECONDS = 60.0  # the documents' checks export and run their own models


@dataclass(frozen=True)
class Cell:
    """How a case's model is made (exporter, opset, dtype) and run (graph optimisation)."""

    exporter: str
    opset: int
    dtype: str
    graph_opt: str = "all"

    @property
    def export_key(self) -> str:
        """What the exported file depends on: cells differing only in graph_opt share it."""
        return f"{self.exporter}-opset{self.opset}-{self.dtype}"

    @property
    def key(self) -> str:
        return f"{self.export_key}-{self.graph_opt}"

    def export_seconds(self, size: str) -> float:
        """Estimated seconds to export a case of tolerance class `size` in this cell."""
        return EXPORT_SECONDS[size] * EXPORTER_FACTOR.get(self.exporter, 1.0)


@dataclass(frozen=True)
class Unit:
    case: str
    cell: str  # Cell.key, MODULE, GIVEN, or "-" for the documents' checks
    runtime: str  # the runtime's report label (tconform.runtimes.labels.runtime_label)
    input_set: str
    group: str  # the units that share one export or module; scheduled together
    cost: float  # estimated seconds to run this unit
    group_cost: float = 0.0  # estimated seconds shared by the group (its export), once

    @property
    def id(self) -> str:
        return unit_id(self.case, self.cell, self.runtime, self.input_set)


def unit_id(case: str, cell: str, runtime: str, input_set: str) -> str:
    return SEPARATOR.join((case, cell, runtime, input_set))


def documents_unit() -> Unit:
    """The documents' checks: one unit per run, whatever their number of results."""
    return Unit(DOCUMENTS, "-", "-", "-", DOCUMENTS, DOCUMENTS_SECONDS)


def result_unit(result: Result) -> str:
    """The id of the unit a result belongs to (every document check's: the documents' unit)."""
    return documents_unit().id if result.case.startswith("doc:") else result.unit


def unchecked_models(results: Iterable[Result]) -> str:
    """Why a whole verify run checked no model ('' when it checked one, or failed): it has ONNX
    lanes (results in a cell other than MODULE's and the documents'), and every one of them was
    skipped or could not run (not applicable, no kernel, a provider absent). Passing rows of the
    PyTorch runtimes check the reference module, not a model. Such a run exits 3."""
    results = list(results)
    onnx = [r for r in results if r.cell not in (MODULE, documents_unit().cell, "")]
    return unchecked_lanes(onnx, results)


def unchecked(results: Iterable[Result], whole_run: bool) -> str:
    """Why a whole run checked no model ('' where it did; unchecked_models). A shard's part of a
    run (`report merge` judges the whole) and the pytest plugin's units are no whole run."""
    return unchecked_models(results) if whole_run else ""


def require_checked(results: Iterable[Result], whole_run: bool) -> None:
    """A whole run that checked no model ends with exit 3, naming why. (Here, not in the
    pipeline: `check`'s parent judges its child's results without importing torch.)"""
    why = unchecked(results, whole_run)
    if why:
        raise TconformError.with_code(why, EXIT_EP_UNAVAILABLE)


def digest(ids: Iterable[str]) -> str:
    """The sha256 of a unit list, independent of its order."""
    return hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()


def split(units: Sequence[Unit], count: int) -> list[list[Unit]]:
    """`units` in `count` shards, each unit in exactly one, groups kept whole, balanced by cost
    (greedy longest processing time first). The same input gives the same split everywhere."""
    groups: dict[str, list[Unit]] = {}
    for unit in units:
        groups.setdefault(unit.group, []).append(unit)

    def cost(name: str) -> float:
        members = groups[name]
        return members[0].group_cost + sum(u.cost for u in members)

    shards: list[list[Unit]] = [[] for _ in range(count)]
    loads = [0.0] * count
    for name in sorted(groups, key=lambda g: (-cost(g), g)):
        lightest = min(range(count), key=lambda k: (loads[k], k))
        shards[lightest] += groups[name]
        loads[lightest] += cost(name)
    return shards


def shard_units(units: Sequence[Unit], index: int, count: int) -> list[Unit]:
    """Shard `index` of `count` (1-based, as `--shard K/N` names it). Groups fill the lowest
    shards first, so beyond the number of groups every shard is empty: only those are laid out,
    and memory does not grow with `count`."""
    groups = len({unit.group for unit in units})
    return split(units, min(count, groups))[index - 1] if index <= groups else []

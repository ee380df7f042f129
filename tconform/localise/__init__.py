"""Localisation: name the PyTorch submodule whose own computation leaves tolerance, only where
the numbers prove it (docs/check.md, "Localisation").

1. Capture (capture.py). The float64 reference runs with hooks on every submodule that keep a
   copy of each call's floating-point inputs and outputs (keyword inputs and dict, tuple or
   ModelOutput outputs included), one record per call.
2. Scopes (scopes.py). Each ONNX node's module scope, from the dynamo exporter's metadata or
   TorchScript's node names; per call, the region of nodes and the tensors crossing it.
3. Plain run (observe.py). The model as it is, twice: the outputs being judged, their own noise,
   and whether a failure lies only at padded positions (then nothing is named).
4. Fetch. A temporary copy of the model returns the boundary tensors as extra outputs (module
   boundaries only, never every tensor); it is the original file's bytes with the extra outputs
   appended (protobuf merges them), so no weight is copied through memory. The tensors come
   back in batches under a byte budget, each batch judged and dropped before the next, and each
   batch's final outputs are compared with the plain run's: observing must not change the run.
5. Judge (judge.py). Each call's tensors paired with the reference's (the same value at that
   boundary: a tensor made inside the call's region, or a unit the exporter fused) and
   compared: the cumulative error, which shows the path the error took.
6. Name (isolate.py, crosscheck.py). Along that path (every matched module where observing
   changed the run), each module in turn is cut out of the model and run on the reference's
   inputs, until one's own error leaves tolerance by more than rounding (its nodes compute
   another function, or the runtime computes them worse than a plain evaluation does): that
   module is named, and `--repro DIR` writes its cut as a bundle to file upstream. A bounded
   number are cut; where none is proven, nothing is named and the verdict says why.
The model file itself is only ever read.
"""

from __future__ import annotations

import contextlib
import functools
import math
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tconform.compare import Tolerance
from tconform.execution import Subject, open_subject
from tconform.heap import trim
from tconform.localise.capture import Call, ModuleTree, capture_calls
from tconform.localise.isolate import (
    MAX_ISOLATED,
    Isolation,
    isolate,
    isolate_whole,
    not_isolatable,
    write_bundle,
)
from tconform.localise.judge import (
    Boundary,
    Regions,
    first_divergence,
    inside,
    judge_call,
    regions_of,
    share_used,
    worst_of,
)
from tconform.localise.observe import (
    Observer,
    PlainRun,
    fails_only_where_padded,
    observer,
    padding_mask,
    plain_run,
)
from tconform.localise.render import render, verdict
from tconform.localise.scopes import Graph
from tconform.models import ModelUnderTest, derived_file, read_graph
from tconform.provenance import ModelProvenance
from tconform.runtimes import Runtime, label

__all__ = [
    "Boundary",
    "Call",
    "Localisation",
    "ModuleTree",
    "capture_calls",
    "localise",
    "render",
]

# Boundary tensors fetched per run, in bytes: bounds localisation's memory on large models.
FETCH_BUDGET = 256 * 2**20
# More than this share of the file's scoped nodes under module paths the module lacks: the
# file is said to be another module's export (a module's own export names its own paths only)
FOREIGN_SHARE = 0.5
ISOLATE = ("first", "all", "none")


@dataclass
class Localisation:
    runtime: str  # e.g. ort-cpu
    model: ModelProvenance | None
    scope_source: str
    extra_outputs: int
    fetch_runs: int  # runs of the model that fetched boundary tensors
    atol: float
    rtol: float
    boundaries: list[Boundary]
    first: Boundary | None  # the module named: the first whose isolated run proves it
    verdict: str
    repro: str | None = None  # the bundle's folder
    atol_scaled: bool = False  # the atol shrinks to each tensor's RMS (a row's, not a user's)
    # the first boundary outside tolerance on inputs within it (cumulative): where the path
    # of the error shows itself first, named or not
    path: Boundary | None = None
    observer: Observer | None = None  # the observed run against the plain one
    # the attention mask whose real positions alone were compared (found, not given), and
    # whether the plain run fails only at its padded positions
    real_positions: str = ""
    padding_only: bool = False
    masked: bool = False  # a mask with padded positions applied (found or --padding-mask)
    isolate_modules: str = "first"
    # the module paths the file's nodes name that the module lacks (another module's export)
    foreign: list[str] = field(default_factory=list)
    isolated: int = 0  # modules cut out and run while naming
    not_reached: int = 0  # candidates left when MAX_ISOLATED were cut

    @property
    def matched(self) -> list[Boundary]:
        return [b for b in self.boundaries if b.status not in ("unmatched", "fused")]

    def to_dict(self) -> dict[str, object]:
        return {
            "runtime": self.runtime,
            "model": self.model.to_dict() if self.model else None,
            "scope_source": self.scope_source,
            "extra_outputs": self.extra_outputs,
            "fetch_runs": self.fetch_runs,
            "atol": self.atol,
            "atol_scaled": self.atol_scaled,
            "rtol": self.rtol,
            "first_divergence": self.first.to_dict() if self.first else None,
            "path_start": self.path.label if self.path else None,
            "observer": self.observer.to_dict() if self.observer else None,
            "real_positions": self.real_positions or None,
            "padding_only": self.padding_only,
            "masked": self.masked,
            "foreign_scopes": self.foreign,
            "isolated": self.isolated,
            "not_reached": self.not_reached,
            "verdict": self.verdict,
            "repro": self.repro,
            "boundaries": [b.to_dict() for b in self.boundaries],
        }


@contextlib.contextmanager
def boundary_copy(
    model: ModelUnderTest, structure: onnx.ModelProto, extra: list[str], types: dict[str, int]
) -> Iterator[ModelUnderTest]:
    """A temporary copy of `model` that also returns `extra`: the file's bytes followed by a
    serialized ModelProto holding only those graph outputs, which a protobuf parser appends to
    the graph's outputs. External data files are copied beside it: ONNX Runtime (1.31) refuses
    a symbolic link that leads out of the model's folder, and a hard link, left behind by a
    process killed mid-run, would alias the model under test."""
    suffix = onnx.ModelProto()
    suffix.graph.output.extend(
        helper.make_tensor_value_info(name, types[name], None)
        if types.get(name, TensorProto.UNDEFINED) != TensorProto.UNDEFINED
        else helper.make_empty_tensor_value_info(name)
        for name in extra
    )
    with tempfile.TemporaryDirectory(prefix="tconform-localise-") as tmp:
        path = Path(tmp) / "model_with_boundaries.onnx"
        with open(model.path, "rb") as source, open(path, "wb") as target:
            shutil.copyfileobj(source, target)
            target.write(suffix.SerializeToString())
        for location in model.provenance.external_data:
            beside = Path(tmp) / location
            beside.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(model.path.parent / location, beside)
        copy = onnx.ModelProto()
        copy.CopyFrom(structure)
        copy.graph.output.extend(suffix.graph.output)
        yield derived_file(path, copy)


def _batches(calls: list[Call], budget: int) -> list[list[Call]]:
    """Calls in groups whose boundary tensors fit `budget` bytes (estimated from the reference's
    copies, float64, at the model's float32: half their size)."""
    batches: list[list[Call]] = [[]]
    used = 0
    for c in calls:
        size = sum(a.nbytes for a in (*c.inputs, *c.outputs)) // 2
        if batches[-1] and used + size > budget:
            batches.append([])
            used = 0
        batches[-1].append(c)
        used += size
    return batches


def _needed(batch: list[Call], regions: Regions, graph: Graph) -> list[str]:
    """The ONNX tensors judging `batch` reads."""
    names: dict[str, None] = {}
    for c in batch:
        if c.path == "":
            names.update(dict.fromkeys(graph.outputs))
            continue
        key = (c.path, c.call)
        names.update(dict.fromkeys(regions.leaving.get(key, [])))
        names.update(dict.fromkeys(regions.entering.get(key, [])))
    return list(names)


def _quiet(function):
    """`function` without numpy's overflow and invalid-value warnings: a float16 run's
    overflow, the reference cast to a narrow type, onnx.reference's arithmetic on a faulty
    cut are what localisation measures, and their figures say so (under -q, not a line each)."""

    @functools.wraps(function)
    def quietly(*args, **kwargs):
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            return function(*args, **kwargs)

    return quietly


@_quiet
def localise(
    model: ModelUnderTest,
    calls: list[Call],
    tree: ModuleTree,
    feeds: dict[str, np.ndarray],
    runtime: Runtime,
    tol: Tolerance,
    provenance: ModelProvenance | None = None,
    isolate_modules: str = "first",
    repro_dir: Path | None = None,
    command: str = "",
    keep: np.ndarray | None = None,
    rounding: Tolerance | None = None,
    budget: int = FETCH_BUDGET,
) -> Localisation:
    """Localise the divergence of `model` from the reference whose `calls` were captured, on
    `runtime`, the model fed `feeds`. provenance: the model under test as results name it
    (default: `model`'s); isolate_modules: "first" (cut out modules along the error's path
    until one is proven), "all" (also every other matched module, for the table) or "none"
    (nothing is cut, and so nothing named); repro_dir: write the named module's bundle there,
    with `command` in its README; keep: a (batch, sequence) mask of the real positions, where
    the check compares only those (--padding-mask); rounding: the precision's own row where
    `tol` is a user's, for a module whose isolated failure no plain evaluation can check (it is
    named only if it leaves that row too)."""
    structure = read_graph(model.path)
    graph = Graph.read(structure, set(tree.classes))
    regions = regions_of(calls, graph, tree)
    whole_call = next(c for c in calls if c.path == "")
    plain = plain_run(model, runtime, feeds, graph.outputs)
    expected = _expected_outputs(whole_call, plain)
    real_positions = ""
    if keep is None:  # padded positions' outputs are undefined: compare the real ones only
        real_positions, keep = padding_mask(feeds)
    padded = (
        keep is not None
        and expected is not None
        and fails_only_where_padded(plain, expected, tol, keep)
    )
    known = set(graph.inputs) | set(graph.outputs)
    cut_regions = [r for r in regions.nodes.values() if r]
    for_isolation = [n for r in cut_regions for n in graph.entering(r, floats_only=False)]
    extra = [n for n in dict.fromkeys([*regions.tensors, *for_isolation]) if n not in known]
    judged = _judge_all(
        model, structure, graph, regions, calls, extra, feeds, runtime, tol, keep, budget, plain,
        expected, isolate_modules, padded,
    )  # fmt: skip
    trim()  # the boundary copy's session is gone
    found = Localisation(
        runtime=label(runtime),
        model=provenance or model.provenance,
        scope_source=graph.scope_source,
        extra_outputs=len(extra),
        fetch_runs=judged.runs,
        atol=tol.atol,
        rtol=tol.rtol,
        atol_scaled=tol.atol_rms is not None,
        boundaries=judged.ordered,
        first=None,
        verdict="",
        path=None if judged.observer_changed else first_divergence(judged.ordered),
        observer=judged.observer,
        real_positions=real_positions,
        padding_only=padded,
        masked=keep is not None and not keep.all(),
        isolate_modules=isolate_modules,
    )
    strange, share = graph.foreign(set(tree.classes))
    if share > FOREIGN_SHARE:
        found.foreign = strange
    if judged.walk or judged.targets:
        whole = onnx.load(str(model.path))

        def refetch(names: list[str]) -> dict[str, np.ndarray]:
            with (
                boundary_copy(model, structure, extra, graph.elem_types) as copy,
                open_subject(runtime, Subject(copy)) as opened,
            ):
                return _fetch(opened, opened.feeds(feeds), names)

        named = _name(
            found, judged, whole, graph, regions, calls, runtime, tol, plain, feeds, keep, refetch,
            rounding,
        )  # fmt: skip
        del whole
        trim()
        if named is not None and repro_dir is not None:
            about = {
                "runtime": found.runtime,
                "command": command,
                "model": found.model.to_dict() if found.model else None,
            }
            found.repro = str(write_bundle(repro_dir, named, found.first, tol, about, keep))
    found.verdict = verdict(found)
    return found


def _expected_outputs(whole: Call, plain: PlainRun) -> dict[str, np.ndarray] | None:
    """The reference's outputs by the model's float output names (None where they do not
    correspond one to one)."""
    if len(whole.outputs) != len(plain.outputs):
        return None
    return dict(zip(plain.outputs, whole.outputs, strict=True))


@dataclass
class _Judged:
    ordered: list[Boundary]  # every call's boundary, in the order calls finish
    targets: list[Boundary]  # the boundaries to cut out, in order: the walk's, then "all"'s
    walk: list[Boundary]  # the candidates for naming, in order
    values: dict[str, np.ndarray]  # the ONNX tensors the targets' cuts need
    runs: int
    observer: Observer | None
    observer_changed: bool


def _judge_all(
    model, structure, graph, regions, calls, extra, feeds, runtime, tol, keep, budget, plain,
    expected, which, padded,
) -> _Judged:  # fmt: skip
    """Every call judged on the boundary copy, batch by batch (the whole module on the plain
    run's outputs, the run being judged); the observed run's final outputs against the plain
    run's; the candidates for naming and the ONNX tensors their cuts need. The copy's session
    lives only as long as this call."""
    by_key = {(c.path, c.call): c for c in calls}
    boundaries: dict[tuple[str, int], Boundary] = {}
    runs = 0
    worst: Observer | None = None
    outputs = list(plain.outputs) if expected is not None else []
    with (
        boundary_copy(model, structure, extra, graph.elem_types) as copy,
        open_subject(runtime, Subject(copy)) as opened,
    ):
        fed = opened.feeds(feeds)
        for batch in _batches(calls, budget):
            values = _fetch(opened, fed, [*outputs, *_needed(batch, regions, graph)])
            graph.learn_types(values)
            runs += 1
            if expected is not None:
                seen = observer({n: values[n] for n in outputs}, plain, expected, tol, keep)
                worst = seen if worst is None or _worse(seen, worst) else worst
            for c in batch:
                # the whole module is judged on the plain run: the run being judged
                seen = {**values, **plain.outputs} if c.path == "" else values
                boundaries[(c.path, c.call)] = judge_call(
                    c, by_key, graph, regions, seen, tol, keep
                )
            del values
        ordered = [boundaries[(c.path, c.call)] for c in calls]
        changed = worst is not None and worst.changed
        walk = _candidates(ordered, changed, which, padded)
        targets = [b for b in walk if b.path and not not_isolatable(graph, b)][:MAX_ISOLATED]
        if which == "all":
            targets += [
                b
                for b in ordered
                if b.path and b.status in ("pass", "fail") and b not in targets
                and not not_isolatable(graph, b)
            ]  # fmt: skip
        values = {}
        if targets:
            values = _fetch(opened, fed, _cut_tensors(graph, targets))
            runs += 1
    return _Judged(ordered, targets, walk, values, runs, worst, changed)


def _cut_tensors(graph: Graph, boundaries: list[Boundary]) -> list[str]:
    """The ONNX tensors that cutting out `boundaries` needs: what enters and leaves each."""
    names = {n for b in boundaries for n in graph.entering(b.region, floats_only=False)}
    return sorted(names | {n for b in boundaries for n in b.onnx_outputs})


def _worse(a: Observer, b: Observer) -> bool:
    return (a.changed, a.used, a.max_diff) > (b.changed, b.used, b.max_diff)


def _candidates(ordered: list[Boundary], changed: bool, which: str, padded: bool):
    """The modules that may be named, in the order calls finish: those whose outputs leave
    tolerance (the error's path, the whole module last), or every matched one where observing
    changed the run (its boundary values are then not the judged run's). Where the run passes,
    those left tolerance inside (absorbed before the outputs): one that computes another
    function is named all the same, the verdict staying the outputs'. None where the failure is
    padding only, or with --isolate none."""
    whole = next(b for b in ordered if b.path == "")
    if which == "none" or padded:
        return []
    if changed and whole.status == "fail":
        return [b for b in ordered if b.status in ("pass", "fail")]
    return [b for b in ordered if b.status == "fail"]


def _name(
    found: Localisation, judged: _Judged, whole, graph, regions, calls, runtime, tol, plain, feeds,
    keep, refetch, rounding=None,
) -> Isolation | None:  # fmt: skip
    """Cut out the candidates in order until one's isolated run proves it (it is `found.first`),
    every "all" target, and the named module's submodules not cut yet (with the ONNX tensors
    `refetch(names)` returns); the named module's isolation, for its bundle."""
    by_key = {(c.path, c.call): c for c in calls}
    guests = {host: guest for guest, host in regions.fused.items()}
    cuts: dict[tuple[str, int], Isolation] = {}

    def cut(b: Boundary) -> Isolation:
        if b.path == "":  # the whole module: its isolated run is the plain run
            return isolate_whole(whole, b, feeds, by_key[b.key], plain, tol, keep, rounding)
        starts = by_key[(guests[b.path], b.call)] if b.path in guests else by_key[b.key]
        ends = by_key[(regions.judged_by(b.path), b.call)]
        return isolate(whole, graph, b, starts, ends, judged.values, runtime, tol, keep, rounding)

    def record(b: Boundary, iso: Isolation) -> None:
        cuts[b.key] = iso
        b.isolated, b.isolated_status = iso.comparisons, iso.status
        b.finding, b.unchecked = iso.finding, iso.unchecked
        if iso.check is not None:
            b.plain_used = _share(iso.check.plain)
            b.exact_used = _share(iso.check.exact) if iso.check.exact is not None else None

    reachable = set(map(id, judged.targets)) | {id(b) for b in judged.walk if b.path == ""}
    for n, b in enumerate(judged.walk):
        why = "" if b.path == "" else not_isolatable(graph, b)
        if why:
            b.not_isolated = why
            continue
        if id(b) not in reachable:  # beyond MAX_ISOLATED
            found.not_reached = len(judged.walk) - n
            break
        record(b, cut(b))
        found.isolated += 1
        if cuts[b.key].proves:
            found.first = b
            break
    for b in judged.targets:  # --isolate all: the rest, for the table
        if b.key not in cuts and found.isolate_modules == "all":
            record(b, cut(b))
    if found.first is not None:
        inner = [
            d
            for d in judged.ordered
            if inside(d.path, found.first.path) and d.status in ("pass", "fail")
            and d.key not in cuts and not not_isolatable(graph, d)
        ]  # fmt: skip
        if inner:
            # Within tolerance in the run, so not candidates: their own errors, the largest
            # growth first, tell which part of the named module the error grows from, and one
            # that fails on its own (its error cancelled in the run) is named instead.
            inner = sorted(inner, key=_growth, reverse=True)[:MAX_ISOLATED]
            judged.values.update(refetch(_cut_tensors(graph, inner)))
            for d in inner:
                record(d, cut(d))
                found.isolated += 1
            found.first = next(
                d for d in judged.ordered if d.key in cuts and cuts[d.key].proves
                and (d is found.first or inside(d.path, found.first.path))
            )  # fmt: skip
    return cuts[found.first.key] if found.first is not None else None


def _growth(b: Boundary) -> float:
    """How many times its inputs' share of the tolerance its outputs take, in the run."""
    outputs = worst_of(b.outputs)
    return (share_used(outputs) if outputs else 0.0) / max(b.worst_input_used or 0.0, 1e-3)


def _share(comparisons) -> float | None:
    """The largest share of the tolerance used; unbounded where a comparison failed without
    figures (a shape or a dtype that differs)."""
    if any(c.status == "fail" and c.max_abs_err is None for c in comparisons):
        return math.inf
    worst = worst_of(comparisons)
    return None if worst is None else share_used(worst)


def _fetch(opened, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """The named tensors from one run (the model's own inputs are the feeds)."""
    wanted = [n for n in dict.fromkeys(names) if n not in feeds]
    values = opened.run(feeds, wanted) if wanted else {}
    return {**{n: feeds[n] for n in names if n in feeds}, **values}

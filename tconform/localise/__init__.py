"""Localisation: name the first PyTorch submodule whose output leaves tolerance, and tell whether
it computes wrong or inherited the error (docs/check.md, "Localisation").

1. Capture (capture.py). The float64 reference runs with hooks on every submodule that keep a
   copy of each call's floating-point inputs and outputs (keyword inputs and dict, tuple or
   ModelOutput outputs included), one record per call.
2. Scopes (scopes.py). Each ONNX node's module scope, from the dynamo exporter's metadata or
   TorchScript's node names; per call, the region of nodes and the tensors crossing it.
3. Fetch. A temporary copy of the model returns those boundary tensors as extra outputs (module
   boundaries only, never every tensor); it is the original file's bytes with the extra outputs
   appended (protobuf merges them), so no weight is copied through memory. The tensors come
   back in batches under a byte budget, each batch judged and dropped before the next.
4. Judge (judge.py). Each call's tensors paired with the reference's and compared; the first
   call whose outputs leave tolerance on inputs within it is the first divergence.
5. Isolate (isolate.py). The first divergence (every module, on request) cut out of the model
   and run on the reference's inputs: its own error beside the cumulative one; `--repro DIR`
   writes that cut as a bundle to file upstream.
The model file itself is only ever read.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tconform.compare import Tolerance
from tconform.execution import Subject, open_subject
from tconform.heap import trim
from tconform.localise.capture import Call, ModuleTree, capture_calls
from tconform.localise.isolate import isolate, write_bundle
from tconform.localise.judge import Boundary, Plan, first_divergence, judge_call, plan
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
    first: Boundary | None
    verdict: str
    repro: str | None = None  # the bundle's folder

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
            "rtol": self.rtol,
            "first_divergence": self.first.to_dict() if self.first else None,
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
    the graph's outputs. External data files are linked beside the copy, never copied."""
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
            link = Path(tmp) / location
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink((model.path.parent / location).resolve(), link)
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


def _needed(batch: list[Call], planned: Plan, graph: Graph) -> list[str]:
    """The ONNX tensors judging `batch` reads."""
    names: dict[str, None] = {}
    for c in batch:
        if c.path == "":
            names.update(dict.fromkeys(graph.outputs))
            continue
        key = (c.path, c.call)
        names.update(dict.fromkeys(planned.leaving.get(key, [])))
        names.update(dict.fromkeys(planned.entering.get(key, [])))
    return list(names)


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
    budget: int = FETCH_BUDGET,
) -> Localisation:
    """Localise the divergence of `model` from the reference whose `calls` were captured, on
    `runtime`, the model fed `feeds`. provenance: the model under test as results name it
    (default: `model`'s); isolate_modules: "first" (the first divergence), "all" (every
    matched module) or "none"; repro_dir: write the first divergence's bundle there, with
    `command` in its README; keep: a (batch, sequence) mask of the real positions, where the
    check compares only those (--padding-mask)."""
    structure = read_graph(model.path)
    graph = Graph.read(structure, set(tree.classes))
    planned = plan(calls, graph, tree)
    by_key = {(c.path, c.call): c for c in calls}
    known = set(graph.inputs) | set(graph.outputs)
    regions = [r for r in planned.regions.values() if r]
    for_isolation = [n for r in regions for n in graph.entering(r, floats_only=False)]
    extra = [n for n in dict.fromkeys([*planned.tensors, *for_isolation]) if n not in known]
    ordered, first, targets, isolation_values, runs = _judge_all(
        model, structure, graph, planned, calls, extra, feeds, runtime, tol, keep, budget,
        isolate_modules,
    )  # fmt: skip
    trim()  # the boundary copy's session is gone
    found = Localisation(
        runtime=label(runtime),
        model=provenance or model.provenance,
        scope_source=graph.scope_source,
        extra_outputs=len(extra),
        fetch_runs=runs,
        atol=tol.atol,
        rtol=tol.rtol,
        boundaries=ordered,
        first=first,
        verdict="",
    )
    if targets:
        whole = onnx.load(str(model.path))
        guests = {host: guest for guest, host in planned.fused.items()}
        for b in targets:
            starts = by_key[(guests[b.path], b.call)] if b.path in guests else by_key[b.key]
            ends = by_key[(planned.judged_by(b.path), b.call)]
            cut = isolate(whole, graph, b, starts, ends, isolation_values, runtime, tol)
            b.isolated, b.isolated_status = cut.comparisons, cut.status
            if b is first and repro_dir is not None:
                about = {
                    "runtime": found.runtime,
                    "command": command,
                    "model": found.model.to_dict() if found.model else None,
                }
                found.repro = str(write_bundle(repro_dir, cut, b, tol, about))
        del whole
        trim()
    found.verdict = verdict(ordered, first)
    return found


def _judge_all(
    model, structure, graph, planned, calls, extra, feeds, runtime, tol, keep, budget, which
):
    """Every call judged on the boundary copy, batch by batch; the first divergence; the
    boundaries to isolate and the ONNX tensors their cuts need. The copy's session lives only
    as long as this call."""
    by_key = {(c.path, c.call): c for c in calls}
    boundaries: dict[tuple[str, int], Boundary] = {}
    runs = 0
    isolation_values: dict[str, np.ndarray] = {}
    with (
        boundary_copy(model, structure, extra, graph.elem_types) as copy,
        open_subject(runtime, Subject(copy)) as opened,
    ):
        fed = opened.feeds(feeds)
        for batch in _batches(calls, budget):
            values = _fetch(opened, fed, _needed(batch, planned, graph))
            runs += 1
            for c in batch:
                boundaries[(c.path, c.call)] = judge_call(
                    c, by_key, graph, planned, values, tol, keep
                )
            del values
        ordered = [boundaries[(c.path, c.call)] for c in calls]
        first = first_divergence(ordered)
        targets = _isolated(ordered, first, which)
        if targets:
            names = {n for b in targets for n in graph.entering(b.region, floats_only=False)}
            names.update(n for b in targets for n in b.onnx_outputs)
            isolation_values = _fetch(opened, fed, sorted(names))
            runs += 1
    return ordered, first, targets, isolation_values, runs


def _isolated(boundaries: list[Boundary], first: Boundary | None, which: str) -> list[Boundary]:
    if which == "all":
        return [b for b in boundaries if b.path and b.status in ("pass", "fail") and b.region]
    return [first] if which == "first" and first is not None and first.path else []


def _fetch(opened, feeds: dict[str, np.ndarray], names: list[str]) -> dict[str, np.ndarray]:
    """The named tensors from one run (the model's own inputs are the feeds)."""
    wanted = [n for n in names if n not in feeds]
    values = dict(zip(wanted, opened.run(feeds, wanted), strict=True)) if wanted else {}
    return {**{n: feeds[n] for n in names if n in feeds}, **values}

"""Judging localisation's boundaries: each module call's reference tensors paired with the ONNX
tensors that cross its region, compared under the tolerance, and the first divergence named.

Pairing (reference tensor -> ONNX tensor) is by shape. Where several tensors of one shape cross
a call's boundary (a rotary embedding's cos and sin), they pair by value, the assignment with
the smallest error. An input that no tensor of its shape carries pairs with the one tensor of
its element count (an exporter that moved a reshape across the boundary), compared reshaped;
several of one count (cos and sin unsqueezed outside the layers that read them) pair by value
as same-shape ones do. Anything else is listed as not matched, never guessed.

Comparing clamps both sides to the model type's finite range, so that a mask fill at the type's
minimum (-1.8e308 in the float64 reference, -3.4e38 in float32) compares equal: both mean
"masked".

The first divergence is the first call, in the order calls finish, whose outputs leave the
tolerance while its inputs were judged within it (or are the model's own, or none are floats).
An input that could not be matched is not within tolerance: such a call is never named, and
its parent is, with the error "in its own ops or a submodule it could not see into". Nothing is
named while the model's outputs are within tolerance: an unmodified model names no divergence.
A Conv whose BatchNorm the exporter folded into it is one unit, judged on the Conv's inputs and
the BatchNorm's outputs.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from tconform.compare import OutputComparison, Tolerance, compare_output, expanded_mask
from tconform.localise.capture import Call, ModuleTree
from tconform.localise.scopes import Graph

# Same-shape tensors up to this many are paired by value (all permutations are tried).
MAX_VALUE_PAIRING = 4


@dataclass(frozen=True)
class Pair:
    onnx: str
    reshaped: bool = False  # compared after a reshape (an exporter moved one across)


def pair_tensors(
    reference: list[np.ndarray],
    candidates: list[str],
    values: dict[str, np.ndarray],
    by_size: bool = False,
) -> tuple[dict[int, Pair], dict[int, str]]:
    """Pair reference tensors (by index) with ONNX tensors; (pairs, why each other is not)."""
    by_shape: dict[tuple[int, ...], list[str]] = defaultdict(list)
    for name in candidates:
        value = values.get(name)
        if value is not None and value.dtype.kind == "f":
            by_shape[value.shape].append(name)
    wanted: dict[tuple[int, ...], list[int]] = defaultdict(list)
    for k, array in enumerate(reference):
        wanted[array.shape].append(k)
    pairs: dict[int, Pair] = {}
    reasons: dict[int, str] = {}
    for shape, keys in wanted.items():
        names = by_shape.get(shape, [])
        if len(names) == len(keys):
            for k, name in _assign(keys, names, reference, values):
                pairs[k] = Pair(name)
        elif names:
            reasons.update(
                dict.fromkeys(
                    keys,
                    f"{len(names)} ONNX tensors of shape {list(shape)} cross its boundary for "
                    f"{len(keys)} of PyTorch's",
                )
            )
        else:
            reasons.update(
                dict.fromkeys(keys, f"no ONNX tensor of shape {list(shape)} crosses its boundary")
            )
    if by_size:
        used = {p.onnx for p in pairs.values()}
        unpaired: dict[int, list[int]] = defaultdict(list)
        for k in reasons:
            unpaired[reference[k].size].append(k)
        for size, keys in unpaired.items():
            # Floats only, as by shape: a quantised model's uint8 copy of a float tensor has
            # its size, and is no value of it.
            same = [
                n
                for n in candidates
                if n not in used
                and n in values
                and values[n].dtype.kind == "f"
                and values[n].size == size
            ]
            if len(same) != len(keys):
                continue
            # a rotary embedding's cos and sin, unsqueezed in the first layer's scope and read
            # by every later layer: each paired by value, as tensors of one shape are
            for k, name in _assign(keys, same, reference, values):
                pairs[k] = Pair(name, reshaped=True)
                used.add(name)
                del reasons[k]
    return pairs, reasons


def _assign(keys, names, reference, values) -> list[tuple[int, str]]:
    """Reference tensors `keys` to ONNX tensors `names` (same shape): the only way, or the
    permutation with the smallest largest error, or graph order where there are too many."""
    if len(keys) == 1 or len(keys) > MAX_VALUE_PAIRING:
        return list(zip(keys, names, strict=True))

    def worst(order) -> float:
        return max(_distance(reference[k], values[n]) for k, n in zip(keys, order, strict=True))

    best = min(itertools.permutations(names), key=worst)
    return list(zip(keys, best, strict=True))


def _distance(expected: np.ndarray, actual: np.ndarray) -> float:
    """The largest difference, `expected` read in `actual`'s shape (one size, paired by it)."""
    expected = expected.reshape(actual.shape)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(clamped(actual, actual.dtype) - clamped(expected, actual.dtype))
    return float(np.nanmax(diff)) if diff.size and not np.isnan(diff).all() else np.inf


def clamped(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """`array` in float64, clamped to the finite range of float type `dtype`."""
    limit = float(np.finfo(dtype).max) if np.dtype(dtype).kind == "f" else np.inf
    return np.clip(array.astype(np.float64), -limit, limit)


def compare_boundary(
    name: str,
    actual: np.ndarray,
    expected: np.ndarray,
    tol: Tolerance,
    reshaped: bool = False,
    keep: np.ndarray | None = None,
    range_of: np.dtype | None = None,
) -> OutputComparison:
    """An ONNX tensor against its float64 reference value, both clamped to the finite range of
    the ONNX type (or of `range_of`: the model's type, for a float64 evaluation of its nodes);
    reshaped to the ONNX tensor's shape where the pair was made by size; where `keep` (a
    (batch, sequence) mask: the real positions) leads the tensor's shape, only there."""
    if reshaped:
        expected = expected.reshape(actual.shape)
    where = None
    if keep is not None and actual.shape[: keep.ndim] == keep.shape:
        where = expanded_mask(keep, actual.ndim)
    limit = actual.dtype if range_of is None else range_of
    return compare_output(name, clamped(actual, limit), clamped(expected, limit), tol, where=where)


def share_used(comparison: OutputComparison) -> float:
    """The share of its tolerance a comparison used; infinite where there was none to use
    (atol = rtol = 0 and an error) or nothing could be compared (a shape)."""
    used = comparison.tolerance_used
    return math.inf if used is None else used


@dataclass
class Boundary:
    """One module call's outputs (and inputs) in the ONNX run against the reference."""

    path: str
    call: int
    calls: int  # how many times the module ran
    cls: str
    status: str  # pass | fail | unmatched | fused
    # pass | fail | none (no float inputs) | unjudged (not all matched) | given (the model's)
    inputs_status: str
    outputs: list[OutputComparison] = field(default_factory=list)
    inputs: list[OutputComparison] = field(default_factory=list)
    onnx_outputs: list[str] = field(default_factory=list)
    output_indices: list[int] = field(default_factory=list)  # the reference output of each
    onnx_inputs: dict[int, str] = field(default_factory=dict)  # reference input -> ONNX name
    reshaped_inputs: list[int] = field(default_factory=list)  # paired by size
    ops: dict[str, int] = field(default_factory=dict)
    own_ops: dict[str, int] = field(default_factory=dict)
    reason: str = ""  # why (some of) it was not matched
    fused_from: str = ""  # a module the exporter folded into this one's nodes (a Conv)
    absorbed: str = ""  # the next module, folded into this one's nodes (a BatchNorm)
    region: list[int] = field(default_factory=list, repr=False)  # its nodes
    isolated: list[OutputComparison] | None = None  # its own error, fed reference inputs
    isolated_status: str = ""  # pass | fail | "" (not isolated)
    # where the isolated run fails: function | runtime | rounding | unchecked (crosscheck.py)
    finding: str = ""
    plain_used: float | None = None  # the plain evaluation's share of the tolerance
    exact_used: float | None = None  # the float64 evaluation's share
    unchecked: str = ""  # why the plain evaluations could not run
    not_isolated: str = ""  # why it could not be cut out, where it was a candidate

    @property
    def key(self) -> tuple[str, int]:
        return self.path, self.call

    @property
    def name(self) -> str:
        return " + ".join(m for m in (self.fused_from, self.path, self.absorbed) if m)

    @property
    def label(self) -> str:
        """The row's name: its module path, `#N` for the Nth call of a module called more than
        once, "(whole module)" for the root."""
        name = self.name or "(whole module)"
        return f"{name}#{self.call + 1}" if self.calls > 1 else name

    @property
    def modules(self) -> list[str]:
        """The module paths this boundary stands for (two for a fused unit)."""
        return [m for m in (self.fused_from, self.path, self.absorbed) if m]

    @property
    def worst(self) -> OutputComparison | None:
        return worst_of(self.outputs)

    @property
    def worst_input_used(self) -> float | None:
        worst = worst_of(self.inputs)
        return None if worst is None else share_used(worst)

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data.pop("region")
        data["label"] = self.label
        data["outputs"] = [o.to_dict() for o in self.outputs]
        data["inputs"] = [o.to_dict() for o in self.inputs]
        if self.isolated is not None:
            data["isolated"] = [o.to_dict() for o in self.isolated]
        return data


def inside(path: str, parent: str) -> bool:
    """Whether module `path` lies inside module `parent` ("" is the whole module)."""
    return path != parent and (parent == "" or path.startswith(parent + "."))


@dataclass
class Regions:
    """What to fetch: per call its region and the ONNX tensors crossing it."""

    nodes: dict[tuple[str, int], list[int]]  # (path, call) -> its nodes (its region)
    leaving: dict[tuple[str, int], list[str]]
    entering: dict[tuple[str, int], list[str]]
    shared: dict[str, str]  # path -> why its calls share one region
    fused: dict[str, str]  # module without nodes -> the module whose nodes read its weights
    # module -> the next module, which has no nodes and whose weights no node reads: folded
    # into this one's nodes (TorchScript folds an eval BatchNorm into the Conv before it), so
    # this module's ONNX outputs are the next one's outputs
    absorbed: dict[str, str] = field(default_factory=dict)

    def judged_by(self, path: str) -> str:
        """The module whose reference outputs `path`'s boundary is judged against."""
        return self.absorbed.get(path, path)

    def folded_into(self, path: str) -> str | None:
        """The module whose nodes hold `path`'s computation, where `path` has none of its own."""
        later = {module: host for host, module in self.absorbed.items()}
        return self.fused.get(path) or later.get(path)

    @property
    def tensors(self) -> list[str]:
        found: dict[str, None] = {}
        for names in (*self.leaving.values(), *self.entering.values()):
            found.update(dict.fromkeys(names))
        return list(found)


def regions_of(calls: list[Call], graph: Graph, tree: ModuleTree) -> Regions:
    by_path: dict[str, list[Call]] = defaultdict(list)
    for c in calls:
        by_path[c.path].append(c)
    result = Regions({}, {}, {}, {}, {})
    if graph.scope_source == "none":
        return result
    for path, path_calls in by_path.items():
        if not path:
            continue
        regions = graph.call_regions(path, len(path_calls))
        if regions is None:
            result.shared[path] = "its calls are not told apart in the graph"
            regions = [graph.region(path)] * len(path_calls)
        for c, region in zip(path_calls, regions, strict=True):
            key = (path, c.call)
            result.nodes[key] = region
            result.leaving[key] = graph.leaving(region)
            result.entering[key] = graph.entering(region)
    for path, path_calls in by_path.items():
        if path and not result.nodes.get((path, 0)) and tree.parameters.get(path):
            host = _fused_host(path, result.nodes, graph)
            if host is not None and len(by_path[host]) == len(path_calls):
                # the exporter fused `path` into `host`'s nodes only if `path` feeds `host` alone
                if _feeds_only(path_calls, by_path[host], calls):
                    result.fused[path] = host
            elif host is None:
                before = _folded_into(path_calls, by_path, result.nodes, calls)
                if before is not None:
                    result.absorbed[before] = path
    return result


def _feeds_only(producers: list[Call], readers: list[Call], calls: list[Call]) -> bool:
    """Whether, call for call, an output of each producer is an input of the reader and of no
    other module call (the reader's own submodules and the modules around it aside): only then
    can an exporter have folded the one into the other's nodes. A value that other modules read
    too (a parallel-residual layer's input, read by both its norms) stays a tensor of its own,
    and pairing it with the reader's outputs would compare two different values."""
    for made, reader in zip(producers, readers, strict=True):
        outputs = [out for out in made.outputs if any(out is x for x in reader.inputs)]
        if not outputs:
            return False
        for c in calls:
            # the reader, its submodules, and the modules around it (which pass the value on)
            if c is reader or inside(c.path, reader.path) or inside(reader.path, c.path):
                continue
            if any(out is x for out in outputs for x in c.inputs):
                return False
    return True


def _folded_into(path_calls: list[Call], by_path, regions, calls: list[Call]) -> str | None:
    """The module whose every call's output is, in the same call, the input of `path_calls`
    and of nothing else (a module with weights but no nodes, and no node reading them): the one
    its computation was folded into, if it has nodes of its own."""
    first = path_calls[0]
    for host, host_calls in by_path.items():
        if host == first.path or len(host_calls) != len(path_calls):
            continue
        related = first.path.startswith(host + ".") or host.startswith(first.path + ".")
        if not regions.get((host, 0)) or related:
            continue
        if _feeds_only(host_calls, path_calls, calls):
            return host
    return None


def _fused_host(path: str, regions, graph: Graph) -> str | None:
    """The module whose nodes read `path`'s weights (the innermost, where several do)."""
    hosts = {
        host
        for (host, _), region in regions.items()
        if host != path and region and graph.reads_weights_of(region, path)
    }
    return max(hosts, key=len) if hosts else None


def judge_call(
    c: Call,
    calls: dict[tuple[str, int], Call],
    graph: Graph,
    regions: Regions,
    values,
    tol,
    keep: np.ndarray | None = None,
) -> Boundary:
    """One call's boundary: its outputs and inputs against the ONNX tensors in `values` (only
    at the real positions `keep`, where given)."""
    if c.path == "":
        b = _whole_module(c, graph, values, tol, keep)
        b.region = graph.region("")
        b.ops, b.own_ops = graph.op_types(b.region), graph.op_types(b.region, "")
        return b
    guest = next((g for g, host in regions.fused.items() if host == c.path), "")
    # A fused unit starts at the folded module's inputs (the Conv's, read by the fused node),
    # and ends at the outputs of a module folded into this one's nodes (a BatchNorm's).
    inputs_of = calls[(guest, c.call)] if guest else c
    judged = replace(c, outputs=calls[(regions.judged_by(c.path), c.call)].outputs)
    region = regions.nodes.get((c.path, c.call), [])
    # Calls that share one region: their tensors pair only where the values of every call
    # pair them all (never one call's with another's by order or by shape alone)
    shared = [calls[(c.path, n)] for n in range(c.calls)] if c.path in regions.shared else None
    b = _judged(judged, inputs_of, region, regions, values, tol, keep, shared)
    b.ops, b.own_ops = graph.op_types(region), graph.op_types(region, c.path)
    b.fused_from = guest
    b.absorbed = regions.absorbed.get(c.path, "")
    folded_into = regions.folded_into(c.path)
    if folded_into is not None:
        b.status = "fused"
        b.reason = f"the exporter folded it into {folded_into}'s nodes"
    elif graph.scope_source == "none":
        b.reason = "the model records no module scopes"
    elif not region:
        b.reason = "no ONNX node carries its scope (the exporter removed or inlined it)"
    elif c.path in regions.shared and b.status == "unmatched":
        b.reason = "; ".join(filter(None, [b.reason, regions.shared[c.path]]))
    return b


def first_divergence(boundaries: list[Boundary]) -> Boundary | None:
    """The first call whose outputs fail on inputs judged within tolerance; None while the
    model's own outputs are within it."""
    root = next((b for b in boundaries if b.path == ""), None)
    if root is None or root.status != "fail":
        return None
    eligible = ("pass", "given", "none")
    return next((b for b in boundaries if b.status == "fail" and b.inputs_status in eligible), None)


def _whole_module(c: Call, graph: Graph, values, tol, keep) -> Boundary:
    """The whole module's outputs are the graph's float outputs, in order."""
    names = [n for n in graph.outputs if n in values and values[n].dtype.kind == "f"]
    b = Boundary("", c.call, c.calls, c.cls, "unmatched", "given")
    if len(names) != len(c.outputs):
        b.reason = f"the model returns {len(names)} float outputs, the module {len(c.outputs)}"
        return b
    b.outputs = [
        compare_boundary(f"(whole module) <- {n}", values[n], ref, tol, keep=keep)
        for n, ref in zip(names, c.outputs, strict=True)
    ]
    b.onnx_outputs = names
    b.output_indices = list(range(len(names)))
    b.status = _status(b.outputs)
    return b


def _judged(
    c: Call, inputs_of: Call, region, regions: Regions, values, tol, keep, shared=None
) -> Boundary:
    key = (c.path, c.call)
    leaving, entering = regions.leaving.get(key, []), regions.entering.get(key, [])
    if shared is None:
        out_pairs, out_why = pair_tensors(c.outputs, leaving, values)
        in_pairs, _ = pair_tensors(inputs_of.inputs, entering, values, by_size=True)
    else:
        out_pairs, out_why = _pair_call(c.call, [s.outputs for s in shared], leaving, values)
        in_pairs, _ = _pair_call(c.call, [s.inputs for s in shared], entering, values)
    outputs = [
        compare_boundary(f"{c.path} <- {p.onnx}", values[p.onnx], c.outputs[k], tol, keep=keep)
        for k, p in sorted(out_pairs.items())
    ]
    ordered = sorted(in_pairs.items())
    inputs = [
        compare_boundary(
            f"{c.path} <- {p.onnx}", values[p.onnx], inputs_of.inputs[k], tol, p.reshaped, keep
        )
        for k, p in ordered
    ]
    if not inputs_of.inputs:
        inputs_status = "none"
    elif len(in_pairs) < len(inputs_of.inputs):
        inputs_status = "unjudged"
    elif any(c.status == "fail" and p.reshaped for c, (_, p) in zip(inputs, ordered, strict=True)):
        inputs_status = "unjudged"  # a reshape that is not a view can fail a good input
    else:
        inputs_status = _status(inputs)
    return Boundary(
        path=c.path,
        call=c.call,
        calls=c.calls,
        cls=c.cls,
        status=_status(outputs) if outputs else "unmatched",
        inputs_status=inputs_status,
        outputs=outputs,
        inputs=inputs,
        onnx_outputs=[out_pairs[k].onnx for k in sorted(out_pairs)],
        output_indices=sorted(out_pairs),
        onnx_inputs={k: p.onnx for k, p in in_pairs.items()},
        reshaped_inputs=sorted(k for k, p in in_pairs.items() if p.reshaped),
        reason="; ".join(dict.fromkeys(out_why.values())),
        region=region,
    )


def _pair_call(call: int, every_call: list[list[np.ndarray]], candidates: list[str], values):
    """Call `call`'s tensors (of `every_call`, the tensors of each call of one module) paired
    with `candidates`, the tensors of the region all the calls share, all calls' at once: a
    tensor pairs only where every call's tensor of its shape has one of its own."""
    start = sum(len(tensors) for tensors in every_call[:call])
    pairs, why = pair_tensors([t for tensors in every_call for t in tensors], candidates, values)
    mine = range(start, start + len(every_call[call]))
    return (
        {k - start: p for k, p in pairs.items() if k in mine},
        {k - start: w for k, w in why.items() if k in mine},
    )


def worst_of(comparisons: list[OutputComparison]) -> OutputComparison | None:
    """The comparison that used the largest share of its tolerance, of those with figures."""
    compared = [o for o in comparisons if o.max_abs_err is not None]
    return max(compared, key=share_used, default=None)


def _status(comparisons: list[OutputComparison]) -> str:
    return "fail" if any(o.status == "fail" for o in comparisons) else "pass"

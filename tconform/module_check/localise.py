"""Localisation: name the first PyTorch submodule whose output leaves tolerance.

Method (docs/check.md, "Localisation"):
1. Scopes. The dynamo exporter records each ONNX node's module scope in the node's metadata
   (`namespace`: ": pkg.Model/layers.0: pkg.Block/layers.0.attn: torch...MultiheadAttention/
   linear: aten.linear.default"). The TorchScript exporter keeps the scope only in node names
   ("/layers.0/attn/MatMul"), which are read as a fallback; a model with neither has no scopes.
2. Boundaries. For a module path P, the nodes whose scope includes P form its region; the float
   tensors produced inside and used outside (or returned by the graph) carry its outputs, and the
   float tensors used inside but produced outside carry its inputs.
3. A temporary copy of the model returns those boundary tensors as extra graph outputs (module
   boundaries only, never every tensor: memory) and runs on the provider. The model file itself
   is never modified.
4. The float64 reference runs with forward hooks on every submodule, which capture each call's
   floating-point inputs and outputs.
5. Matching is by shape: a PyTorch tensor is paired with the one ONNX boundary tensor of its
   shape; repeated calls of one module are paired in execution order; anything else is listed
   as not matched, never guessed.
6. In execution order (the order calls finish), each boundary's error is compared with the
   tolerance; the first module whose output leaves it while its inputs were within it is named,
   with its error figures and the ONNX op types inside it.
"""

from __future__ import annotations

import tempfile
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper
from torch import nn

from tconform import registry
from tconform.compare import OutputComparison, Tolerance, compare_output, tolerance_for
from tconform.config import PRESETS, ModelConfig
from tconform.execution import Subject, open_subject
from tconform.export import ExportSettings, build_module
from tconform.models import derived_file
from tconform.module_check.inputs import ModuleInputs
from tconform.provenance import ModelProvenance
from tconform.runtimes import Runtime, label, make_runtime
from tconform.runtimes.torch import eval_mode, flatten_outputs, plain_composition
from tconform.weights import DEFAULT_SEED

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
SCOPE_SOURCES = ("dynamo metadata", "TorchScript node names", "none")


# --- the reference side: forward hooks ---------------------------------------------------------


@dataclass
class Call:
    """One call of one module in the reference: its floating-point inputs and outputs."""

    path: str  # "" for the module itself
    call: int  # 0 for its first call, 1 for its second, ...
    cls: str
    inputs: list[np.ndarray]
    outputs: list[np.ndarray]


def _float_tensors(value: object) -> list[torch.Tensor]:
    unique: dict[int, torch.Tensor] = {}
    for _, t in flatten_outputs(value):
        if t.is_floating_point():
            unique.setdefault(id(t), t)
    return list(unique.values())


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().to(torch.float64).numpy()


def capture_calls(module: nn.Module, inputs: ModuleInputs) -> list[Call]:
    """Every module call's float inputs and outputs, in the order the calls finish."""
    paths = {id(m): name for name, m in module.named_modules()}
    counts: Counter[str] = Counter()
    open_calls: list[tuple[str, int, list[np.ndarray]]] = []
    calls: list[Call] = []

    def before(mod, args, kwargs):
        path = paths[id(mod)]
        open_calls.append((path, counts[path], [_numpy(t) for t in _float_tensors((args, kwargs))]))
        counts[path] += 1

    def after(mod, args, kwargs, output):
        path, call, ins = open_calls.pop()
        outs = [_numpy(t) for _, t in flatten_outputs(output) if t.is_floating_point()]
        cls = type(mod)
        calls.append(Call(path, call, f"{cls.__module__}.{cls.__qualname__}", ins, outs))

    handles = []
    for m in module.modules():
        handles.append(m.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(m.register_forward_hook(after, with_kwargs=True))
    try:
        with eval_mode(module), plain_composition(), torch.no_grad():
            module(*inputs.args, **inputs.kwargs)
    finally:
        for handle in handles:
            handle.remove()
    return calls


# --- the ONNX side: scopes and boundary tensors ------------------------------------------------


def dynamo_scope(namespace: str | None) -> tuple[str, ...] | None:
    """': pkg.M/layers.0: pkg.Block/layers.0.ln: ...LayerNorm/layer_norm: aten...' ->
    ('', 'layers.0', 'layers.0.ln'). The last segment is the node's own op, not a module.
    None where the node records no module scope."""
    paths = [segment.split(": ", 1)[0] for segment in (namespace or "").split("/")[:-1]]
    if not paths or paths[0] != "":  # no namespace, or one made outside any module call
        return None
    return tuple(paths)


def _common_scope(scopes: list[tuple[str, ...]]) -> tuple[str, ...]:
    common = scopes[0]
    for scope in scopes[1:]:
        n = 0
        while n < min(len(common), len(scope)) and common[n] == scope[n]:
            n += 1
        common = common[:n]
    return common or ("",)


def torchscript_scope(node_name: str) -> tuple[str, ...] | None:
    """'/layers.0/ln/LayerNormalization' -> ('', 'layers.0', 'layers.0.ln'); '/Add' -> ('',).
    None for a name without a scope ('Identity_3', made by one of the exporter's passes)."""
    if not node_name.startswith("/"):
        return None
    parts = node_name.split("/")[1:-1]
    return ("", *(".".join(parts[: i + 1]) for i in range(len(parts))))


@dataclass
class Graph:
    """The top-level graph of a model with each node's module scope."""

    model: onnx.ModelProto
    scope_source: str
    scopes: list[tuple[str, ...]]  # per node, outermost first, "" (the whole module) included
    producer: dict[str, int]
    consumers: dict[str, set[int]]
    elem_types: dict[str, int]
    dynamic: set[str]  # tensors that depend on a graph input (the rest are constants)
    inputs: list[str]
    outputs: list[str]

    @classmethod
    def read(cls, model: onnx.ModelProto) -> Graph:
        g = model.graph
        nodes = list(g.node)
        namespaces = [
            next((p.value for p in n.metadata_props if p.key == "namespace"), None) for n in nodes
        ]
        recorded: list[tuple[str, ...] | None]
        if any(namespaces):
            source = SCOPE_SOURCES[0]
            recorded = [dynamo_scope(ns) for ns in namespaces]
        elif any(n.name.startswith("/") for n in nodes):
            source = SCOPE_SOURCES[1]
            recorded = [torchscript_scope(n.name) for n in nodes]
        else:
            source = SCOPE_SOURCES[2]
            recorded = [("",) for _ in nodes]
        initializers = {i.name for i in g.initializer}
        inputs = [i.name for i in g.input if i.name not in initializers]
        producer, consumers = {}, defaultdict(set)
        dynamic = set(inputs)
        for index, node in enumerate(nodes):
            for name in node.input:
                consumers[name].add(index)
            for name in node.output:
                producer[name] = index
            if any(name in dynamic for name in node.input):
                dynamic.update(o for o in node.output if o)
        elem_types = {
            v.name: v.type.tensor_type.elem_type for v in (*g.value_info, *g.input, *g.output)
        }
        # Nodes the exporter's optimiser made (a Split of a fused projection, say) record no
        # scope: such a node sits in the innermost scope around the nodes it reads from and
        # feeds (the whole module when none of them records one).
        scopes = []
        for index, node in enumerate(nodes):
            scope = recorded[index]
            if scope is None:
                around = [producer[name] for name in node.input if name in producer]
                around += [j for name in node.output for j in consumers.get(name, ())]
                known = [recorded[j] for j in around if recorded[j] is not None]
                scope = _common_scope(known) if known else ("",)
            scopes.append(scope)
        return cls(
            model,
            source,
            scopes,
            producer,
            dict(consumers),
            elem_types,
            dynamic,
            inputs,
            [o.name for o in g.output],
        )

    def is_float(self, name: str) -> bool:
        """Floating-point, or of unknown type (settled by the value it takes at run time)."""
        elem_type = self.elem_types.get(name, TensorProto.UNDEFINED)
        return elem_type in FLOAT_TYPES or elem_type == TensorProto.UNDEFINED

    def region(self, path: str) -> list[int]:
        return [i for i, scope in enumerate(self.scopes) if path in scope]

    def leaving(self, region: list[int]) -> list[str]:
        """Float tensors made inside the region and used outside it, in graph order."""
        inside = set(region)
        found = []
        for i in region:
            for name in self.model.graph.node[i].output:
                used_outside = name in self.outputs or bool(
                    self.consumers.get(name, set()) - inside
                )
                if name and used_outside and name in self.dynamic and self.is_float(name):
                    found.append(name)
        return found

    def entering(self, region: list[int]) -> list[str]:
        """Float tensors used inside the region and made outside it (not constants)."""
        inside = set(region)
        found: dict[str, None] = {}
        for i in region:
            for name in self.model.graph.node[i].input:
                made_inside = self.producer.get(name) in inside
                if name and not made_inside and name in self.dynamic and self.is_float(name):
                    found.setdefault(name)
        return list(found)

    def op_types(self, region: list[int], own_path: str | None = None) -> dict[str, int]:
        """Op type counts in the region (only the nodes whose innermost scope is own_path,
        when given)."""
        nodes = self.model.graph.node
        return dict(
            Counter(
                nodes[i].op_type
                for i in region
                if own_path is None or self.scopes[i][-1] == own_path
            )
        )


def run_with_boundaries(
    graph: Graph, extra: list[str], feeds: dict[str, np.ndarray], runtime: Runtime
) -> dict[str, np.ndarray]:
    """Run a temporary copy of the model that also returns `extra`; name -> value."""
    copy = onnx.ModelProto()
    copy.CopyFrom(graph.model)
    for name in extra:
        elem_type = graph.elem_types.get(name, TensorProto.UNDEFINED)
        copy.graph.output.append(
            helper.make_tensor_value_info(name, elem_type, None)
            if elem_type != TensorProto.UNDEFINED
            else helper.make_empty_tensor_value_info(name)
        )
    weights = sum(int(np.prod(t.dims)) for t in copy.graph.initializer) * 4
    with tempfile.TemporaryDirectory(prefix="tconform-localise-") as tmp:
        path = Path(tmp) / "model_with_boundaries.onnx"
        # Models near protobuf's 2 GB limit keep their weights in a file beside the copy.
        onnx.save_model(copy, str(path), save_as_external_data=weights > 1 << 30)
        with open_subject(runtime, Subject(derived_file(path, copy))) as opened:
            values = opened.run(feeds)
            return dict(zip(opened.outputs, values, strict=True))


# --- matching and verdict ----------------------------------------------------------------------


@dataclass
class Boundary:
    """One module call's outputs (and inputs) in the ONNX run against the reference."""

    path: str
    call: int
    calls: int  # how many times the module ran
    cls: str
    status: str  # pass | fail | unmatched
    # pass | fail | none (no float inputs) | unjudged (not all matched) | given (the model's)
    inputs_status: str
    outputs: list[OutputComparison] = field(default_factory=list)
    inputs: list[OutputComparison] = field(default_factory=list)
    onnx_outputs: list[str] = field(default_factory=list)
    ops: dict[str, int] = field(default_factory=dict)
    own_ops: dict[str, int] = field(default_factory=dict)
    reason: str = ""  # why (some of) it was not matched

    @property
    def label(self) -> str:
        name = self.path or "(whole module)"
        return f"{name} (call {self.call + 1})" if self.calls > 1 else name

    @property
    def worst(self) -> OutputComparison | None:
        compared = [o for o in self.outputs if o.tolerance_used is not None]
        return max(compared, key=lambda o: o.tolerance_used or 0.0) if compared else None

    @property
    def worst_input_used(self) -> float | None:
        used = [o.tolerance_used for o in self.inputs if o.tolerance_used is not None]
        return max(used) if used else None

    def to_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["outputs"] = [o.to_dict() for o in self.outputs]
        data["inputs"] = [o.to_dict() for o in self.inputs]
        return data


def _pair(
    per_call: list[list[np.ndarray]], candidates: list[str], values: dict[str, np.ndarray]
) -> tuple[dict[tuple[int, int], str], dict[tuple[int, int], str]]:
    """Pair reference tensors ((call, index) -> array) with ONNX tensors by shape.

    Returns (paired, reasons): the ONNX name for each paired tensor, why for each unpaired one.
    One tensor of a shape on each side is a pair; a shape that each of several calls produces
    once pairs in execution order (the exporter keeps the order of calls); the rest are left.
    """
    by_shape: dict[tuple[int, ...], list[str]] = defaultdict(list)
    for name in candidates:
        value = values.get(name)
        if value is not None and value.dtype.kind == "f":
            by_shape[value.shape].append(name)
    wanted: dict[tuple[int, ...], list[tuple[int, int]]] = defaultdict(list)
    for c, arrays in enumerate(per_call):
        for k, array in enumerate(arrays):
            wanted[array.shape].append((c, k))
    paired, reasons = {}, {}
    for shape, keys in wanted.items():
        names = by_shape.get(shape, [])
        one_per_call = len({c for c, _ in keys}) == len(keys)
        if len(names) == len(keys) and (len(keys) == 1 or one_per_call):
            paired.update(zip(keys, names, strict=True))
            continue
        why = (
            f"no ONNX tensor of shape {list(shape)} crosses its scope"
            if not names
            else f"{len(names)} ONNX tensors of shape {list(shape)} cross its scope for "
            f"{len(keys)} of PyTorch's"
        )
        reasons.update(dict.fromkeys(keys, why))
    return paired, reasons


def _compare(
    label: str, arrays: list[np.ndarray], call: int, paired, values, tol
) -> tuple[list[OutputComparison], list[str]]:
    found, onnx_names = [], []
    for k, array in enumerate(arrays):
        name = paired.get((call, k))
        if name is not None:
            found.append(compare_output(f"{label} <- {name}", values[name], array, tol))
            onnx_names.append(name)
    return found, onnx_names


def _pair_whole_module(
    call: Call, graph: Graph, values: dict[str, np.ndarray]
) -> tuple[dict[tuple[int, int], str], dict[tuple[int, int], str]]:
    """The whole module's outputs are the graph's float outputs, in order."""
    names = [n for n in graph.outputs if values[n].dtype.kind == "f"]
    keys = [(0, k) for k in range(len(call.outputs))]
    if len(names) == len(keys):
        return dict(zip(keys, names, strict=True)), {}
    why = f"the model returns {len(names)} float outputs, the module {len(keys)}"
    return {}, dict.fromkeys(keys, why)


def _status(comparisons: list[OutputComparison]) -> str:
    return "fail" if any(o.status == "fail" for o in comparisons) else "pass"


def _boundaries(
    calls: list[Call], graph: Graph, values: dict[str, np.ndarray], tol: Tolerance
) -> list[Boundary]:
    by_path: dict[str, list[Call]] = defaultdict(list)
    for c in calls:
        by_path[c.path].append(c)
    regions = {path: graph.region(path) for path in by_path}
    matches = {}
    for path, path_calls in by_path.items():
        if path == "":
            matches[path] = (_pair_whole_module(path_calls[0], graph, values), ({}, {}))
            continue
        region = regions[path]
        matches[path] = (
            _pair([c.outputs for c in path_calls], graph.leaving(region), values),
            _pair([c.inputs for c in path_calls], graph.entering(region), values),
        )
    boundaries = []
    for c in calls:
        (out_pairs, out_why), (in_pairs, _) = matches[c.path]
        region = regions[c.path]
        outputs, names = _compare(c.path, c.outputs, c.call, out_pairs, values, tol)
        inputs, _ = _compare(c.path, c.inputs, c.call, in_pairs, values, tol)
        reasons = [why for (call, _), why in out_why.items() if call == c.call]
        if c.path and graph.scope_source == "none":
            reasons = ["the model records no module scopes"]
        elif c.path and not region:
            reasons = ["no ONNX node carries its scope (the exporter removed or inlined it)"]
        if c.path == "":
            inputs_status = "given"  # the model's own inputs: the same values on both sides
        elif not c.inputs:
            inputs_status = "none"
        elif len(inputs) < len(c.inputs) and _status(inputs) == "pass":
            inputs_status = "unjudged"
        else:
            inputs_status = _status(inputs)
        boundaries.append(
            Boundary(
                path=c.path,
                call=c.call,
                calls=len(by_path[c.path]),
                cls=c.cls,
                status=_status(outputs) if outputs else "unmatched",
                inputs_status=inputs_status,
                outputs=outputs,
                inputs=inputs,
                onnx_outputs=names,
                ops=graph.op_types(region),
                own_ops=graph.op_types(region, c.path),
                reason="; ".join(dict.fromkeys(reasons)),
            )
        )
    return boundaries


@dataclass
class Localisation:
    runtime: str  # e.g. onnxruntime-cpu
    model: ModelProvenance | None
    scope_source: str
    extra_outputs: int
    atol: float
    rtol: float
    boundaries: list[Boundary]
    first: Boundary | None
    verdict: str

    @property
    def matched(self) -> list[Boundary]:
        return [b for b in self.boundaries if b.status != "unmatched"]

    def to_dict(self) -> dict[str, object]:
        return {
            "runtime": self.runtime,
            "model": self.model.to_dict() if self.model else None,
            "scope_source": self.scope_source,
            "extra_outputs": self.extra_outputs,
            "atol": self.atol,
            "rtol": self.rtol,
            "first_divergence": self.first.to_dict() if self.first else None,
            "verdict": self.verdict,
            "boundaries": [b.to_dict() for b in self.boundaries],
        }


def _ops(ops: dict[str, int]) -> str:
    return ", ".join(f"{op} x{n}" for op, n in sorted(ops.items(), key=lambda i: -i[1])) or "none"


def _share(used: float | None) -> str:
    if used is None:
        return "-"
    return f"{used:.1%}" if used < 10 else f"{used:.0f}x"


def _verdict(boundaries: list[Boundary], first: Boundary | None) -> str:
    if first is None:
        failing = [b for b in boundaries if b.status == "fail"]
        if failing:
            return (
                f"every module outside tolerance already had an input outside it; the earliest "
                f"is {failing[0].label}"
            )
        return "every matched module boundary is within tolerance"
    worst = first.worst
    assert worst is not None
    where = f"{first.label} ({first.cls})"
    figures = (
        f"max abs err {worst.max_abs_err:.3g} at {worst.max_abs_index}, max rel err "
        f"{worst.max_rel_err:.3g}, {worst.mismatches} elements outside tolerance, "
        f"{_share(worst.tolerance_used)} of the tolerance used"
    )
    inputs = {
        "pass": f"its inputs were within tolerance ({_share(first.worst_input_used)} used)",
        "none": "it has no floating-point inputs",
        "unjudged": "its inputs could not all be matched, so they were not all judged",
        "given": "its inputs are the model's inputs",
    }[first.inputs_status]
    inner = [
        b
        for b in boundaries
        if b.status != "unmatched" and b.path != first.path and b.path.startswith(first.path)
    ]
    own = ""
    if inner and not any(b.status == "fail" and b.inputs_status != "fail" for b in inner):
        own = (
            "; none of its submodules diverged on good inputs, so the error starts in its "
            f"own ops ({_ops(first.own_ops)})"
        )
    return (
        f"first divergence: {where}: {figures}; {inputs}; ONNX ops inside: {_ops(first.ops)}{own}"
    )


def judge(calls: list[Call], graph: Graph, values, tol: Tolerance) -> tuple[list, Boundary | None]:
    boundaries = _boundaries(calls, graph, values, tol)
    first = next((b for b in boundaries if b.status == "fail" and b.inputs_status != "fail"), None)
    return boundaries, first


def localise(
    model_path: Path,
    reference: nn.Module,
    reference_inputs: ModuleInputs,
    feeds: dict[str, np.ndarray],
    runtime: Runtime,
    tol: Tolerance,
    provenance: ModelProvenance | None = None,
) -> Localisation:
    """Localise the divergence of the ONNX model at `model_path` from `reference` (a float64
    module, called with `reference_inputs`; the model is fed `feeds`) on `runtime`."""
    graph = Graph.read(onnx.load(str(model_path)))
    calls = capture_calls(reference, reference_inputs)
    wanted: dict[str, None] = {}
    if graph.scope_source != "none":
        for path in dict.fromkeys(c.path for c in calls if c.path):
            region = graph.region(path)
            wanted.update(dict.fromkeys([*graph.leaving(region), *graph.entering(region)]))
    known = set(graph.inputs) | set(graph.outputs)
    extra = [name for name in wanted if name not in known]
    values = {**feeds, **run_with_boundaries(graph, extra, feeds, runtime)}
    boundaries, first = judge(calls, graph, values, tol)
    return Localisation(
        runtime=label(runtime),
        model=provenance,
        scope_source=graph.scope_source,
        extra_outputs=len(extra),
        atol=tol.atol,
        rtol=tol.rtol,
        boundaries=boundaries,
        first=first,
        verdict=_verdict(boundaries, first),
    )


# How the table marks a boundary's inputs: within tolerance, outside it, no float inputs, not
# all matched, or the model's own inputs.
_INPUT_MARKS = {"pass": "ok", "fail": "OUT", "none": "-", "unjudged": "?", "given": "in"}


def render(loc: Localisation) -> str:
    """The localisation report for the terminal (and the markdown report, in a code block)."""
    model = loc.model.path if loc.model else "the model"
    lines = [
        f"localisation on {loc.runtime}: {len(loc.boundaries)} module calls, "
        f"{len(loc.matched)} matched to ONNX tensors (scopes from {loc.scope_source}); "
        f"a temporary copy of {model} returned {loc.extra_outputs} boundary tensors; "
        f"atol {loc.atol:g}, rtol {loc.rtol:g}",
    ]
    header = ("module", "class", "max abs err", "tol used", "inputs", "status")
    rows = [header]
    for b in loc.boundaries:
        worst = b.worst
        rows.append(
            (
                b.label,
                b.cls.rsplit(".", 1)[-1],
                "-" if worst is None else f"{worst.max_abs_err:.2e}",
                _share(worst.tolerance_used if worst else None),
                "-" if b.status == "unmatched" else _INPUT_MARKS[b.inputs_status],
                b.status.upper() if b.status == "fail" else b.status,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for n, row in enumerate(rows):
        text = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        if n > 0 and loc.first is loc.boundaries[n - 1]:
            text += "  <- first divergence"
        lines.append("  " + text)
        if n == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    unmatched = [b for b in loc.boundaries if b.status == "unmatched"]
    if unmatched:
        lines.append("  not matched, not compared:")
        reasons: dict[str, list[str]] = defaultdict(list)
        for b in unmatched:
            reasons[b.reason or "no ONNX tensor matched"].append(b.label)
        for why, labels in reasons.items():
            lines.append(f"    {', '.join(labels)}: {why}")
    lines.append(loc.verdict)
    return "\n".join(lines)


# --- the shipped cases ------------------------------------------------------------------------


def localise_case(
    case_name: str,
    model_path: Path,
    inputs: dict[str, np.ndarray],
    cfg: ModelConfig | None = None,
    seed: int = DEFAULT_SEED,
    runtime: Runtime | None = None,
    tol: Tolerance | None = None,
    provenance: ModelProvenance | None = None,
) -> Localisation:
    """Localise a registry case's exported model (e.g. `transformer`) against its float64
    reference module: the case's module built with tconform's parameters (cfg: default the
    tiny preset), in float64; the parameters are float32 values, so the float64 copy holds
    exactly the exported weights.

    inputs: the case's inputs by name, as the model takes them (a golden input set, or
    registry.make_inputs). tol: default the case's float32 tolerance.
    """
    case = registry.get_case(case_name)
    cfg = cfg or PRESETS["tiny"]
    module, _ = build_module(case, ExportSettings(cfg, seed))
    specs = case.inputs(cfg)
    args = tuple(
        torch.tensor(np.asarray(inputs[s.name]), dtype=torch.float64)
        if s.kind == "float"
        else torch.tensor(np.asarray(inputs[s.name]))
        for s in specs
    )
    return localise(
        model_path,
        module.double(),
        ModuleInputs(args, {}, tuple(s.name for s in specs)),
        {s.name: np.asarray(inputs[s.name]) for s in specs},
        runtime or make_runtime("onnxruntime"),
        tol or tolerance_for("float32", case.tolerance),
        provenance,
    )

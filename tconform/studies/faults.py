"""Graph edits: the onnx Python API operations that inject a mistake into an exported model.

The building blocks below work on any model the dynamo exporter wrote. They find nodes by op type
and by the module scope the exporter records in each node's metadata_props under `namespace`,
for example (wrapped here)

    : pkg.Model/encoder.layers.0: pkg.Layer/encoder.layers.0.self_attn.w_k: torch.nn.Linear/
    linear_1: aten.linear.default

and every edit returns a new model (the input is never changed) that keeps the node order
topological and the names of the graph's inputs and outputs:

    node = find_node(model, "MatMul", scope="decoder.layers.1.ffn.w2")  # first in graph order
    faulty = scale_weight(model, "decoder.layers.1.ffn.w2", 1.001)      # that weight x1.001
    faulty = set_attribute(model, find_node(model, "Softmax"), "axis", -2)
    faulty = insert_after(model, node.output[0], cast_round_trip())    # float16 rounding there
    faulty = bypass(model, node, keep_input=0)                          # skip a node

Models are checked with onnx.checker (full check) and keep their IR version, so ONNX Runtime
1.31 (IR <= 10 from the exporters) loads them. The catalogue of named faults built from these
edits is tconform.studies.fault_catalogue.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tconform.localise.scopes import dynamo_modules, node_namespace

# ---------------------------------------------------------------------------------------------
# Finding nodes and tensors


def module_of(node: onnx.NodeProto) -> tuple[str, str]:
    """(path, class) of the innermost module that produced `node`, from the scope the dynamo
    exporter recorded (tconform.localise.scopes reads it): ('encoder.layers.0.self_attn.w_k',
    'torch.nn.modules.linear.Linear'). The top module's path is ''; ('', '') for a node with no
    scope."""
    modules = dynamo_modules(node_namespace(node))
    return modules[-1] if modules else ("", "")


def find_nodes(
    model: onnx.ModelProto,
    op_type: str | None = None,
    scope: str | None = None,
    module_class: str | tuple[str, ...] | None = None,
) -> list[onnx.NodeProto]:
    """Nodes of the main graph in graph order, filtered by op type, by a substring of the
    namespace (`scope`: a module path such as 'layers.0.ffn' or a class such as 'Norm'), and by
    what the innermost module's class name ends with (`module_class`: one or a tuple)."""
    found = []
    for node in model.graph.node:
        if op_type is not None and node.op_type != op_type:
            continue
        if scope is not None and scope not in (node_namespace(node) or ""):
            continue
        if module_class is not None and not module_of(node)[1].endswith(module_class):
            continue
        found.append(node)
    return found


def find_node(
    model: onnx.ModelProto,
    op_type: str | None = None,
    scope: str | None = None,
    module_class: str | tuple[str, ...] | None = None,
    where: Callable[[onnx.NodeProto], bool] = lambda node: True,
) -> onnx.NodeProto:
    """The first node that `find_nodes` matches and `where` accepts; LookupError if none."""
    for node in find_nodes(model, op_type, scope, module_class):
        if where(node):
            return node
    wanted = ", ".join(
        f"{k}={v!r}"
        for k, v in (("op_type", op_type), ("scope", scope), ("module_class", module_class))
        if v is not None
    )
    raise LookupError(f"no node with {wanted or 'any attributes'} matches in {model.graph.name}")


def initializer(model: onnx.ModelProto, name: str) -> onnx.TensorProto | None:
    for tensor in model.graph.initializer:
        if tensor.name == name:
            return tensor
    return None


def producer(model: onnx.ModelProto, tensor: str) -> onnx.NodeProto | None:
    """The node that computes `tensor` (None for graph inputs and initializers)."""
    for node in model.graph.node:
        if tensor in node.output:
            return node
    return None


def initializer_input(model: onnx.ModelProto, node: onnx.NodeProto) -> int:
    """The index of `node`'s first input that is an initializer (a weight, a constant)."""
    for i, name in enumerate(node.input):
        if initializer(model, name) is not None:
            return i
    raise LookupError(f"{node.op_type} {node.name!r} reads no initializer")


def reads_initializer(model: onnx.ModelProto) -> Callable[[onnx.NodeProto], bool]:
    names = {t.name for t in model.graph.initializer}
    return lambda node: any(name in names for name in node.input)


# ---------------------------------------------------------------------------------------------
# Edits: each returns a new, checked model


def _copy(message):
    """A deep copy of a protobuf message (a model, node or tensor)."""
    new = type(message)()
    new.CopyFrom(message)
    return new


def _read_names(graph: onnx.GraphProto) -> set[str]:
    """Every tensor name that a node of `graph` or of its subgraphs reads, and its outputs."""
    names = {v.name for v in graph.output}
    for node in graph.node:
        names.update(node.input)
        for attribute in node.attribute:
            for subgraph in (attribute.g, *attribute.graphs):
                names |= _read_names(subgraph)
    return names


def _finish(original: onnx.ModelProto, edited: onnx.ModelProto) -> onnx.ModelProto:
    """Drop the initializers that the edit left unread (ONNX Runtime warns about each), then
    check the model."""
    was_read, is_read = _read_names(original.graph), _read_names(edited.graph)
    kept = [t for t in edited.graph.initializer if t.name in is_read or t.name not in was_read]
    if len(kept) < len(edited.graph.initializer):
        kept = [_copy(t) for t in kept]
        del edited.graph.initializer[:]
        edited.graph.initializer.extend(kept)
    onnx.checker.check_model(edited, full_check=True)
    return edited


def _index(model: onnx.ModelProto, node: onnx.NodeProto) -> int:
    """Where `node` (found in this model or in an identical copy) sits in graph.node; a node is
    known by its first output, unique in an SSA graph."""
    for i, candidate in enumerate(model.graph.node):
        if list(candidate.output) == list(node.output):
            return i
    raise LookupError(f"node {node.op_type} -> {list(node.output)} is not in this model")


def fresh_name(model: onnx.ModelProto, base: str) -> str:
    """A tensor/node name not used anywhere in the main graph."""
    graph = model.graph
    used = {t.name for t in graph.initializer}
    used.update(v.name for v in (*graph.input, *graph.output, *graph.value_info))
    for node in graph.node:
        used.update((*node.input, *node.output, node.name))
    name, n = base, 0
    while name in used:
        n += 1
        name = f"{base}_{n}"
    return name


def _splice(model: onnx.ModelProto, index: int, remove: int, nodes: Iterable[onnx.NodeProto]):
    """Replace `remove` nodes at `index` by `nodes` (copies: protobuf containers own them)."""
    kept = [_copy(n) for n in model.graph.node]
    kept[index : index + remove] = [_copy(n) for n in nodes]
    del model.graph.node[:]
    model.graph.node.extend(kept)


def _in_scope_of(anchor: onnx.NodeProto, node: onnx.NodeProto) -> onnx.NodeProto:
    """`node` with the anchor's namespace, so that localisation by scope still finds it."""
    for prop in anchor.metadata_props:
        if prop.key == "namespace":
            node.metadata_props.add(key=prop.key, value=prop.value)
    return node


def set_attribute(
    model: onnx.ModelProto, node: onnx.NodeProto, name: str, value: object
) -> onnx.ModelProto:
    """`node` with attribute `name` set to `value` (added when missing)."""
    new = _copy(model)
    target = new.graph.node[_index(new, node)]
    kept = [a for a in target.attribute if a.name != name]
    del target.attribute[:]
    target.attribute.extend([*kept, helper.make_attribute(name, value)])
    return _finish(model, new)


def constant_input(model: onnx.ModelProto, node: onnx.NodeProto, input_index: int) -> np.ndarray:
    """The value of a node input that is an initializer (LookupError otherwise)."""
    tensor = initializer(model, node.input[input_index])
    if tensor is None:
        raise LookupError(f"input {input_index} of {node.op_type} {node.name!r} is computed")
    return numpy_helper.to_array(tensor)


def replace_input(
    model: onnx.ModelProto, node: onnx.NodeProto, input_index: int, value: np.ndarray
) -> onnx.ModelProto:
    """`node` reading `value` (a new initializer) at `input_index`; every other node that reads
    the old tensor keeps it (exporters share constants between nodes)."""
    new = _copy(model)
    target = new.graph.node[_index(new, node)]
    name = fresh_name(new, f"{target.input[input_index]}_fault")
    new.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name=name))
    target.input[input_index] = name
    return _finish(model, new)


def scale_input(
    model: onnx.ModelProto,
    node: onnx.NodeProto,
    input_index: int,
    factor: float,
    element: int | None = None,
) -> onnx.ModelProto:
    """`node`'s initializer input times `factor`: all of it, or only its flat `element`."""
    value = constant_input(model, node, input_index).copy()
    if element is None:
        value = (value * factor).astype(value.dtype)
    else:
        value.flat[element] = value.flat[element] * factor
    return replace_input(model, node, input_index, value)


def scale_weight(
    model: onnx.ModelProto,
    scope: str | None,
    factor: float,
    op_type: str | None = "MatMul",
    element: int | None = None,
) -> onnx.ModelProto:
    """The initializer read by the first node of `op_type` (any op when None) whose namespace
    contains `scope` (any node when None), times `factor`: all of it, or only its flat
    `element`. scale_weight(m, "decoder.layers.1.ffn.w2", 1.001) scales that Linear's weight;
    scale_weight(m, "norm2", 1.001, op_type="LayerNormalization") a norm's gain."""
    node = find_node(model, op_type, scope, where=reads_initializer(model))
    return scale_input(model, node, initializer_input(model, node), factor, element)


def replace_initializer(model: onnx.ModelProto, name: str, value: np.ndarray) -> onnx.ModelProto:
    """Initializer `name` holding `value` instead (same name: every reader sees the change)."""
    new = _copy(model)
    tensor = initializer(new, name)
    if tensor is None:
        raise LookupError(f"no initializer {name!r}")
    stored = helper.tensor_dtype_to_np_dtype(tensor.data_type)  # a bfloat16 table stays one
    tensor.CopyFrom(numpy_helper.from_array(np.asarray(value).astype(stored), name=name))
    return _finish(model, new)


def bypass(model: onnx.ModelProto, node: onnx.NodeProto, keep_input: int) -> onnx.ModelProto:
    """`node` replaced by an Identity of its input `keep_input`: the node's work is skipped and
    its output name kept (e.g. a residual Add that forgets the residual)."""
    new = _copy(model)
    index = _index(new, node)
    old = new.graph.node[index]
    identity = helper.make_node("Identity", [old.input[keep_input]], [old.output[0]], old.name)
    _splice(new, index, 1, [_in_scope_of(old, identity)])
    return _finish(model, new)


NodeBuilder = Callable[[str, str, Callable[[str], str]], list[onnx.NodeProto]]
"""build(input, output, fresh) -> nodes computing `output` from `input`; fresh(base) gives an
unused name for intermediate tensors."""


def replace_node(model: onnx.ModelProto, node: onnx.NodeProto, build: NodeBuilder):
    """A one-input, one-output `node` replaced by the nodes `build` makes (same tensor names)."""
    new = _copy(model)
    index = _index(new, node)
    old = new.graph.node[index]
    nodes = build(old.input[0], old.output[0], _namer(new))
    _splice(new, index, 1, [_in_scope_of(old, n) for n in nodes])
    return _finish(model, new)


def insert_after(model: onnx.ModelProto, tensor: str, build: NodeBuilder) -> onnx.ModelProto:
    """Nodes made by `build` between `tensor` and everything that reads it: its producer now
    writes a fresh name, and the new nodes compute `tensor` from that (graph outputs keep
    their names)."""
    new = _copy(model)
    source = producer(new, tensor)
    if source is None:
        raise LookupError(f"{tensor!r} is a graph input or initializer: no node computes it")
    index = _index(new, source)
    fresh = _namer(new)
    renamed = fresh(f"{tensor}_before_fault")
    source.output[list(source.output).index(tensor)] = renamed
    nodes = [_in_scope_of(source, n) for n in build(renamed, tensor, fresh)]
    _splice(new, index + 1, 0, nodes)
    return _finish(model, new)


def _namer(model: onnx.ModelProto) -> Callable[[str], str]:
    """fresh(base): unused names, none handed out twice (the model is not yet edited)."""
    taken: set[str] = set()

    def fresh(base: str) -> str:
        name, n = fresh_name(model, base), 0
        while name in taken:
            n += 1
            name = fresh_name(model, f"{base}_{n}")
        taken.add(name)
        return name

    return fresh


# ---------------------------------------------------------------------------------------------
# Node builders (float32 models; where a builder takes a type, any float type)


def _scalar(name: str, value: float, dtype: np.dtype = np.float32) -> onnx.NodeProto:
    tensor = numpy_helper.from_array(np.array(value, dtype=np.float32).astype(dtype), name=name)
    return helper.make_node("Constant", [], [name], value=tensor)


def elem_type(model: onnx.ModelProto, tensor: str) -> int:
    """The element type of `tensor` as the graph declares or ONNX's shape inference infers it
    (TensorProto.FLOAT where neither says)."""
    found = initializer(model, tensor)
    if found is not None:
        return found.data_type
    for graph in (model.graph, onnx.shape_inference.infer_shapes(model).graph):
        for value in (*graph.input, *graph.output, *graph.value_info):
            if value.name == tensor and value.type.tensor_type.elem_type:
                return value.type.tensor_type.elem_type
    return TensorProto.FLOAT


def gelu(
    x: str, y: str, fresh: Callable[[str], str], dtype: np.dtype = np.float32
) -> list[onnx.NodeProto]:
    """y = 0.5 x (1 + erf(x / sqrt(2))): GELU from opset-13 ops (ONNX's Gelu needs opset 20);
    its constants in `dtype`, the type of x."""
    root2, one, half = fresh("sqrt2"), fresh("one"), fresh("half")
    scaled, erf, shifted, halved = (fresh(f"gelu_{s}") for s in ("div", "erf", "add", "mul"))
    return [
        _scalar(root2, float(np.sqrt(2.0)), dtype),
        _scalar(one, 1.0, dtype),
        _scalar(half, 0.5, dtype),
        helper.make_node("Div", [x, root2], [scaled]),
        helper.make_node("Erf", [scaled], [erf]),
        helper.make_node("Add", [erf, one], [shifted]),
        helper.make_node("Mul", [x, half], [halved]),
        helper.make_node("Mul", [halved, shifted], [y]),
    ]


def cast_round_trip(dtype: int = TensorProto.FLOAT16, back: int = TensorProto.FLOAT) -> NodeBuilder:
    """Cast to `dtype` and back to `back` (the graph's own type, float32 by default): the
    precision of `dtype` in that graph."""

    def build(x: str, y: str, fresh: Callable[[str], str]) -> list[onnx.NodeProto]:
        narrow = fresh(f"{x}_{helper.tensor_dtype_to_np_dtype(dtype).name}")
        return [
            helper.make_node("Cast", [x], [narrow], to=dtype),
            helper.make_node("Cast", [narrow], [y], to=back),
        ]

    return build


def reverse_axis(axis: int) -> NodeBuilder:
    """Reverse the order along `axis` (a Slice with step -1)."""

    def build(x: str, y: str, fresh: Callable[[str], str]) -> list[onnx.NodeProto]:
        names = {k: fresh(f"reverse_{k}") for k in ("starts", "ends", "axes", "steps")}
        values = {"starts": -1, "ends": np.iinfo(np.int64).min, "axes": axis, "steps": -1}
        constants = [
            helper.make_node(
                "Constant",
                [],
                [names[k]],
                value=numpy_helper.from_array(np.array([v], dtype=np.int64), names[k]),
            )
            for k, v in values.items()
        ]
        return [*constants, helper.make_node("Slice", [x, *names.values()], [y])]

    return build

"""The ONNX side of localisation: which PyTorch module each node of an exported graph came from,
and which tensors cross each module call's boundary.

Scopes. The dynamo exporter records a node's module scope in its metadata (`namespace`:
": pkg.Model/layers.0: pkg.Block/layers.0.ln: ...LayerNorm/layer_norm: aten..."); the
TorchScript exporter only in node names ("/layers.0/ln/LayerNormalization"), whose segments are
local names ("/layer1/layer1.0/conv1/Conv" is module layer1.0.conv1, "/act_1/Relu" the second
call of module act), resolved here against the module's own tree. A graph with neither has no
scopes. Nodes an optimiser made without a scope sit in the innermost scope around their
neighbours.

Calls. A module called twice has one scope for both calls in dynamo's record; its nodes split
into one region per call by connectivity (nodes joined by a tensor one makes and another reads,
or by an input both read), or, for calls one after another that the graph joins (a layer applied
again and again), into runs of the same ops in graph order. Where neither gives one region per
call, the calls share one region, and a call's tensors pair only with what the values prove
(tconform.localise.judge).
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass

import onnx
from onnx import TensorProto

from tconform.noops import MOVES

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16}
SCOPE_SOURCES = ("dynamo metadata", "TorchScript node names", "none")
# Ops whose output is their input unchanged in value: such an output leaving a region carries
# what entered it, not what the module made.
PASS_THROUGH = {"Identity", "Cast"}
# Ops whose output is a tensor's shape, not anything computed from its values
SHAPE_OF = {"Shape", "Size"}
# Ops that compute no float value, only choose, copy or convert one: what they make from
# integers, booleans and constants is exact (a mask's Where(mask, 0, -inf)).
CHOOSES = MOVES | {"Where", "ConstantOfShape"}


def dynamo_modules(namespace: str | None) -> list[tuple[str, str]] | None:
    """': pkg.M/layers.0: pkg.Block/layers.0.ln: ...LayerNorm/layer_norm: aten...' ->
    [('', 'pkg.M'), ('layers.0', 'pkg.Block'), ('layers.0.ln', '...LayerNorm')]: each module
    scope's (path, class), outermost first. The last segment is the node's own op, not a module.
    None where the node records no module scope. (The one reader of this record: localisation
    and the fault injector both use it.)"""
    modules = []
    for segment in (namespace or "").split("/")[:-1]:
        path, _, cls = segment.partition(": ")
        modules.append((path.strip(), cls.strip()))
    if not modules or modules[0][0] != "":  # no namespace, or one made outside any module call
        return None
    return modules


def dynamo_scope(namespace: str | None) -> tuple[str, ...] | None:
    """The paths of `dynamo_modules`: ('', 'layers.0', 'layers.0.ln')."""
    modules = dynamo_modules(namespace)
    return None if modules is None else tuple(path for path, _ in modules)


def node_namespace(node: onnx.NodeProto) -> str | None:
    return next((p.value for p in node.metadata_props if p.key == "namespace"), None)


_CALL_SUFFIX = re.compile(r"^(.*)_(\d+)$")


def torchscript_scope(
    node_name: str, modules: set[str]
) -> tuple[tuple[str, ...], tuple[int, ...]] | None:
    """'/layer1/layer1.0/conv1/Conv' -> (('', 'layer1', 'layer1.0', 'layer1.0.conv1'),
    (0, 0, 0, 0)), with `modules` the module paths; '/act_1/Relu' -> (('', 'act'), (0, 1)):
    the call of each module of the scope. None for a name without a scope (made by one of the
    exporter's passes)."""
    if not node_name.startswith("/"):
        return None
    path, scope, calls = "", [""], [0]
    for segment in node_name.split("/")[1:-1]:
        found, call = _child(path, segment, modules), 0
        if found is None:
            numbered = _CALL_SUFFIX.match(segment)
            found = _child(path, numbered.group(1), modules) if numbered else None
            if found is None:
                break  # a segment that names no module: the scope ends above it
            call = int(numbered.group(2))
        path = found
        scope.append(path)
        calls.append(call)
    return tuple(scope), tuple(calls)


def _child(path: str, segment: str, modules: set[str]) -> str | None:
    """The submodule of `path` that TorchScript names `segment`: its attribute name, or under
    a container the container's own name and the index ('layer1.0' under 'layer1'), or the one
    deeper module of that name, reached past modules that were never called (transformers'
    OPTForCausalLM calls `self.model.decoder` itself: '/model/decoder' is model.model.decoder;
    where several would fit, none is taken)."""
    direct = f"{path}.{segment}" if path else segment
    if direct in modules:
        return direct
    last = path.rsplit(".", 1)[-1]
    if path and segment.startswith(last + "."):
        nested = path + segment[len(last) :]
        if nested in modules:
            return nested
    below = f"{path}." if path else ""
    deeper = [m for m in modules if m.startswith(below) and m.endswith(f".{segment}")]
    return deeper[0] if len(deeper) == 1 else None


def _common_scope(scopes: list[tuple[str, ...]]) -> tuple[str, ...]:
    common = scopes[0]
    for scope in scopes[1:]:
        n = 0
        while n < min(len(common), len(scope)) and common[n] == scope[n]:
            n += 1
        common = common[:n]
    return common or ("",)


def _is_float(elem_types: dict[str, int], name: str) -> bool:
    elem_type = elem_types.get(name, TensorProto.UNDEFINED)
    return elem_type in FLOAT_TYPES or elem_type == TensorProto.UNDEFINED


@dataclass
class Graph:
    """The top-level graph of a model with each node's module scope."""

    model: onnx.ModelProto
    scope_source: str
    scopes: list[tuple[str, ...]]  # per node, outermost first, "" (the whole module) included
    call_index: list[tuple[int, ...] | None]  # per node: the call of each scope's module
    producer: dict[str, int]
    consumers: dict[str, set[int]]
    elem_types: dict[str, int]
    dynamic: set[str]  # tensors that depend on a graph input (the rest are constants)
    # tensors that depend on a graph input's values, not only on its shape (a GRU's initial
    # state of zeros, expanded to the batch, depends on the input's shape alone)
    valued: set[str]
    # float tensors made from the inputs' integers and booleans and from constants by ops that
    # compute no float value (CHOOSES): exact, whatever the runtime (an attention mask's fill)
    exact: set[str]
    inputs: list[str]
    outputs: list[str]
    initializers: set[str]

    @classmethod
    def read(cls, model: onnx.ModelProto, modules: set[str]) -> Graph:
        """`modules`: the module's paths, which TorchScript's local names resolve against."""
        g = model.graph
        nodes = list(g.node)
        namespaces = [node_namespace(n) for n in nodes]
        recorded: list[tuple[str, ...] | None]
        calls: list[tuple[int, ...] | None] = [None] * len(nodes)
        if any(namespaces):
            source = SCOPE_SOURCES[0]
            recorded = [dynamo_scope(ns) for ns in namespaces]
        elif any(n.name.startswith("/") for n in nodes):
            source = SCOPE_SOURCES[1]
            recorded = []
            for index, node in enumerate(nodes):
                found = torchscript_scope(node.name, modules)
                recorded.append(found[0] if found else None)
                calls[index] = found[1] if found else None
        else:
            source = SCOPE_SOURCES[2]
            recorded = [("",) for _ in nodes]
        initializers = {i.name for i in g.initializer}
        inputs = [i.name for i in g.input if i.name not in initializers]
        producer, consumers = {}, defaultdict(set)
        dynamic, valued = set(inputs), set(inputs)
        for index, node in enumerate(nodes):
            for name in node.input:
                consumers[name].add(index)
            for name in node.output:
                producer[name] = index
            if any(name in dynamic for name in node.input):
                dynamic.update(o for o in node.output if o)
            if node.op_type not in SHAPE_OF and any(name in valued for name in node.input):
                valued.update(o for o in node.output if o)
        elem_types = {
            v.name: v.type.tensor_type.elem_type for v in (*g.value_info, *g.input, *g.output)
        }
        elem_types.update({t.name: t.data_type for t in g.initializer})
        exact: set[str] = set()
        for node in nodes:  # in graph order: a node's inputs are settled before it
            floats = [n for n in node.input if n in dynamic and _is_float(elem_types, n)]
            if node.op_type in CHOOSES and all(n in exact for n in floats):
                exact.update(o for o in node.output if o in dynamic and _is_float(elem_types, o))
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
            model, source, scopes, calls, producer, dict(consumers), elem_types, dynamic,
            valued, exact, inputs, [o.name for o in g.output], initializers,
        )  # fmt: skip

    def is_float(self, name: str) -> bool:
        """Floating-point, or of unknown type (settled by the value it takes at run time)."""
        return _is_float(self.elem_types, name)

    def foreign(self, modules: set[str]) -> tuple[list[str], float]:
        """The module paths the file's nodes are scoped to that `modules` (the module's own)
        lacks, and the share of scoped nodes they hold: most of a file's nodes under paths the
        module does not have is an export of another module, whatever pairs by chance."""
        scoped = [scope[-1] for scope in self.scopes if scope and scope[-1]]
        strange = [path for path in scoped if path not in modules]
        return list(dict.fromkeys(strange)), len(strange) / len(scoped) if scoped else 0.0

    def learn_types(self, values: dict) -> None:
        """The types tensors the file leaves untyped ran with (a TorchScript export's int64
        bucket index for T5's relative attention bias): an integer is then no float input a
        cut would need paired with the reference's."""
        for name, value in values.items():
            if self.elem_types.get(name, TensorProto.UNDEFINED) == TensorProto.UNDEFINED:
                self.elem_types[name] = onnx.helper.np_dtype_to_tensor_dtype(value.dtype)

    def region(self, path: str) -> list[int]:
        return [i for i, scope in enumerate(self.scopes) if path in scope]

    def call_regions(self, path: str, calls: int) -> list[list[int]] | None:
        """One region per call of `path`, in call order; None where the graph does not tell
        the calls apart (they then share `region(path)`)."""
        region = self.region(path)
        if calls == 1 or not region:
            return [region] * calls
        recorded = [self.call_index[i] for i in region]
        if None not in recorded:  # TorchScript named each call
            by_call: dict[int, list[int]] = defaultdict(list)
            for i, levels in zip(region, recorded, strict=True):
                by_call[levels[self.scopes[i].index(path)]].append(i)
            if sorted(by_call) == list(range(calls)):
                return [by_call[c] for c in range(calls)]
        parts = self._components(region)
        return parts if len(parts) == calls else self._chained(region, calls)

    def _chained(self, region: list[int], calls: int) -> list[list[int]] | None:
        """Calls one after another that the graph joins, each reading what the one before made
        (a layer applied again and again, its residual inside it): the region, in graph order,
        cut into `calls` runs of the same op types, each reading, of the region's tensors, only
        its own and the run's before; None where it does not cut so."""
        if len(region) % calls:
            return None
        size = len(region) // calls
        runs = [region[k * size : (k + 1) * size] for k in range(calls)]
        nodes = self.model.graph.node
        kinds = [[nodes[i].op_type for i in run] for run in runs]
        if any(k != kinds[0] for k in kinds[1:]):
            return None
        run_of = {i: k for k, run in enumerate(runs) for i in run}
        for k, run in enumerate(runs):
            for i in run:
                made = (self.producer.get(name) for name in nodes[i].input if name)
                if any(m in run_of and run_of[m] not in (k, k - 1) for m in made):
                    return None
        return runs

    def _components(self, region: list[int]) -> list[list[int]]:
        """The region's nodes in groups joined by a tensor one makes and another reads, or by a
        tensor from outside that two of them read; groups in the order of their first node."""
        parent = {i: i for i in region}

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        readers: dict[str, list[int]] = defaultdict(list)
        for i in region:
            for name in self.model.graph.node[i].input:
                if name and name in self.dynamic:
                    readers[name].append(i)
                    made = self.producer.get(name)
                    if made in parent:
                        parent[root(i)] = root(made)
        for group in readers.values():
            for i in group[1:]:
                parent[root(i)] = root(group[0])
        groups: dict[int, list[int]] = defaultdict(list)
        for i in region:
            groups[root(i)].append(i)
        return sorted(groups.values(), key=min)

    def leaving(self, region: list[int]) -> list[str]:
        """Float tensors made inside the region and used outside it (or returned), in graph
        order; a pass-through (Identity or Cast of a tensor from outside) carries what entered,
        not what the module made, and is left out. Where some depend on the inputs' values,
        those alone: one made from a shape beside them (a GRU's initial state of zeros that
        the next LSTM reuses, a rotary table made in the first layer that every layer reads)
        is no output of a module computing values, and has an output's shape by chance. A
        region all of whose tensors are made from shapes (a rotary table's) keeps them."""
        inside = set(region)
        nodes = self.model.graph.node
        found = []
        for i in region:
            node = nodes[i]
            if node.op_type in PASS_THROUGH and self.producer.get(node.input[0]) not in inside:
                continue
            for name in node.output:
                used_outside = name in self.outputs or bool(
                    self.consumers.get(name, set()) - inside
                )
                if name and used_outside and name in self.dynamic and self.is_float(name):
                    found.append(name)
        valued = [name for name in found if name in self.valued]
        return valued or found

    def entering(self, region: list[int], floats_only: bool = True) -> list[str]:
        """Tensors used inside the region and made outside it that depend on the model's inputs
        (constants are not inputs), floats only unless asked."""
        inside = set(region)
        found: dict[str, None] = {}
        for i in region:
            for name in self.model.graph.node[i].input:
                made_inside = self.producer.get(name) in inside
                if not name or made_inside or name not in self.dynamic:
                    continue
                if self.is_float(name) or not floats_only:
                    found.setdefault(name)
        return list(found)

    def reads_weights_of(self, region: list[int], prefix: str) -> bool:
        """Whether a node of the region reads an initializer named after module `prefix`
        (its weight, fused into this region's node by the exporter)."""
        nodes = self.model.graph.node
        return any(
            name in self.initializers and name.startswith(prefix + ".")
            for i in region
            for name in nodes[i].input
        )

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

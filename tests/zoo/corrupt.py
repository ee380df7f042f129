"""Corrupt one weight of one named module in an exported ONNX model, for localisation tests:
noise far outside any tolerance (`corrupt_module_weight`), or the weight scaled by a factor
such as 1.01 (`scale_module_weight`).

The module's nodes are found from what the exporter recorded, read here independently of
tconform's own reader (so a test of localisation does not test the reader against itself):

- dynamo: each node's `metadata_props` key `namespace`, for example
  `: pkg.M/blocks.2: pkg.Block/blocks.2.ln_1: torch.nn...LayerNorm/layer_norm: aten.layer_norm`;
  the module paths are the part before each `: `, the last segment is the node's own op;
- TorchScript: the node name, `/blocks.2/ln_1/LayerNormalization` (relative names joined by
  `.` give the path).

The weight is looked up through the nodes (and the Identity nodes between a node and an
initializer), never by name: the dynamo exporter renames the
(transposed) weights of `nn.Linear` (`val_39`), while biases, norm and convolution weights keep
their module-path names (`blocks.2.ln_1.weight`); the TorchScript exporter names MatMul weights
`onnx::MatMul_123`. Among the float initializers that the module's own nodes read (its
innermost scope; else any node inside it), the largest is corrupted (ties: the first read),
which is the weight of a Linear or a convolution, the gain of a norm, the table of an embedding.

An initializer that nodes outside the module read too (tied embeddings, the TorchScript
exporter's de-duplicated identical weights) is not changed in place: the module's own nodes
get a corrupted private copy (`<name>.corrupted`), so only that module computes something else.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16}


@dataclass(frozen=True)
class Corruption:
    """What `corrupt_module_weight` did."""

    path: Path  # the corrupted copy
    initializer: str  # the name of the initializer that was changed (as in the source model)
    module: str  # the module path whose weight it is
    op_type: str  # the op type of the first node of the module that reads it
    # read outside the module too: its nodes got a corrupted private copy (where the module has
    # nodes of its own; else it was changed in place, for every reader)
    shared: bool
    written_as: str  # the initializer's name in the corrupted copy
    max_change: float  # the largest absolute change made to one element


def node_scope(node: onnx.NodeProto) -> tuple[str, ...] | None:
    """The module paths the node lies in, outermost first ("" is the whole module); None for a
    node that records no scope (made by an optimiser pass, or outside any module call)."""
    namespace = next((p.value for p in node.metadata_props if p.key == "namespace"), None)
    if namespace is not None:
        paths = [segment.split(": ", 1)[0] for segment in namespace.split("/")[:-1]]
        return tuple(paths) if paths and paths[0] == "" else None
    if node.name.startswith("/"):
        return torchscript_paths(node.name.split("/")[1:-1])
    return None


def torchscript_paths(segments: list[str]) -> tuple[str, ...]:
    """The module paths of a TorchScript node name's segments, outermost first.

    A segment is the last part of the module's path, or its last two parts where the last is
    an index (a child of an nn.Sequential or nn.ModuleList): `/layer1/layer1.0/conv1/Conv` is
    `layer1.0.conv1` (the Sequential `layer1` is called, so it has a segment of its own);
    `/layers.2/linear1/MatMul` is `layers.2.linear1` (a ModuleList is never called). A module's
    second call is named `relu_1`; that suffix is left as it is.
    """
    paths, path = [""], ""
    for segment in segments:
        head, _, index = segment.rpartition(".")
        if head and index.isdigit() and path.rsplit(".", 1)[-1] == head:
            segment = index  # the container is the segment before: do not repeat its name
        path = f"{path}.{segment}" if path else segment
        paths.append(path)
    return tuple(paths)


def module_nodes(model: onnx.ModelProto, module: str) -> tuple[list[int], list[int]]:
    """Indices of the top-level nodes inside `module`: (its own, innermost scope `module`; all
    of them, its submodules' included)."""
    own, inside = [], []
    for i, node in enumerate(model.graph.node):
        scope = node_scope(node)
        if scope is None or module not in scope:
            continue
        inside.append(i)
        if scope[-1] == module:
            own.append(i)
    return own, inside


def _aliases(model: onnx.ModelProto) -> dict[str, str]:
    """Tensor name -> the initializer it is, through `Identity` nodes (the TorchScript exporter
    de-duplicates identical weights so: `Identity(onnx::MatMul_7) -> onnx::MatMul_8`)."""
    initializers = {t.name for t in model.graph.initializer}
    alias = {name: name for name in initializers}
    for node in model.graph.node:
        if node.op_type == "Identity" and node.input and node.input[0] in alias:
            alias[node.output[0]] = alias[node.input[0]]
    return alias


def _readers(model: onnx.ModelProto, initializer: str, alias: dict[str, str]) -> set[int]:
    """The nodes that read `initializer`, directly or through Identity nodes."""
    return {
        i
        for i, node in enumerate(model.graph.node)
        if node.op_type != "Identity" and any(alias.get(x) == initializer for x in node.input)
    }


def find_weight(model: onnx.ModelProto, module: str) -> tuple[str, int, bool]:
    """(initializer name, index of the first node of the module reading it, whether nodes
    outside the module read it too) for the module's largest float weight."""
    initializers = {t.name: t for t in model.graph.initializer}
    alias = _aliases(model)
    own, inside = module_nodes(model, module)
    nodes = model.graph.node
    if not inside:
        # A module whose nodes the exporter's optimiser merged into another module's (dynamo
        # folds a BatchNorm into the Conv before it, and the fused Conv records the BatchNorm's
        # scope): its weight may still carry its name, `conv1.weight`.
        named = [
            n
            for n, t in initializers.items()
            if n.startswith(module + ".") and t.data_type in FLOAT_TYPES
        ]
        if not named:
            raise LookupError(f"no node of the model records module {module!r} in its scope")
        name = max(named, key=lambda n: int(np.prod(initializers[n].dims)))
        readers = _readers(model, name, alias)
        scopes = {node_scope(nodes[j]) for j in readers}
        return name, min(readers), len(scopes) > 1
    for group in (own, inside):
        candidates: dict[str, int] = {}
        for i in group:
            for read in nodes[i].input:
                name = alias.get(read)
                t = initializers.get(name) if name else None
                if t is not None and t.data_type in FLOAT_TYPES and int(np.prod(t.dims)) > 1:
                    candidates.setdefault(name, i)
        if candidates:
            name = max(candidates, key=lambda n: int(np.prod(initializers[n].dims)))
            return name, candidates[name], bool(_readers(model, name, alias) - set(inside))
    raise LookupError(f"module {module!r}: none of its nodes reads a float weight")


def corrupt_module_weight(
    model_path: str | Path,
    module: str,
    out_dir: str | Path | None = None,
    *,
    scale: float = 0.5,
    seed: int = 0,
) -> Corruption:
    """A copy of the ONNX model at `model_path` with one weight of `module` corrupted.

    The weight gets seeded Gaussian noise of standard deviation `scale` times its largest
    magnitude (at least `scale` * 0.1), far outside any float32 tolerance, on every element
    (a single element could sit where nothing reads it: an unused embedding row). The copy is
    written to `out_dir` (default: a new temporary folder the caller removes) as
    `corrupted.onnx`; the source is only read.
    """

    def noisy(array: np.ndarray) -> np.ndarray:
        spread = scale * max(float(np.abs(array).max()), 0.1)
        noise = np.random.default_rng(seed).standard_normal(array.shape) * spread
        return (array.astype(np.float64) + noise).astype(array.dtype)

    return _rewrite_weight(model_path, module, out_dir, noisy)


def scale_module_weight(
    model_path: str | Path, module: str, out_dir: str | Path | None = None, factor: float = 1.01
) -> Corruption:
    """A copy of the ONNX model at `model_path` with one weight of `module` (the matrix of a
    Linear, as `corrupt_module_weight` finds it) multiplied by `factor`: a subtle mistake, 1 %
    by default, of the size a wrong scale or a stale checkpoint makes."""
    return _rewrite_weight(
        model_path, module, out_dir, lambda a: (a.astype(np.float64) * factor).astype(a.dtype)
    )


def _rewrite_weight(model_path, module: str, out_dir, change) -> Corruption:
    model = onnx.load(str(model_path))
    name, reader, shared = find_weight(model, module)
    weight = next(t for t in model.graph.initializer if t.name == name)
    array = numpy_helper.to_array(weight)
    changed = change(array)
    written_as = name
    _, inside = module_nodes(model, module)
    if shared and inside:
        written_as = f"{name}.corrupted"
        model.graph.initializer.append(numpy_helper.from_array(changed, written_as))
        alias = _aliases(model)
        for i in inside:
            node = model.graph.node[i]
            for k, value in enumerate(node.input):
                if alias.get(value) == name:
                    node.input[k] = written_as
    else:
        weight.CopyFrom(numpy_helper.from_array(changed, name))
    folder = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="corrupt-"))
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / "corrupted.onnx"
    onnx.save(model, str(target))
    return Corruption(
        path=target,
        initializer=name,
        module=module,
        op_type=model.graph.node[reader].op_type,
        shared=shared,
        written_as=written_as,
        max_change=float(np.abs(changed.astype(np.float64) - array).max()),
    )

"""Nodes that compute nothing: what no precision row is earned by.

A model's row comes from the computation that reaches its outputs (tconform.provenance). A node
that moves a value (a reshape, a Cast), applies its op's neutral constant (x * 1, x + 0), takes
a product that sums nothing (an identity, a permutation, a diagonal), or belongs to a run of
steps that together compute nothing (a rotation and its transpose, x + c - c) adds no error of
its own type, so float16 no-ops around a float32 model buy it no float16 row; nor does a value
that is zero whatever the inputs (x * 0, x - x) make what computed it live. Constants are read
on demand, from the file where the graph was read without them.
"""

from __future__ import annotations

import math
from pathlib import Path

# Ops that move, copy or relabel values without arithmetic: the type they carry says nothing
# of the precision a model computes in (Cast pairs, Identity chains, reshapes).
MOVES = frozenset(
    {
        "Identity", "Cast", "CastLike", "Reshape", "Transpose", "Squeeze", "Unsqueeze",
        "Flatten", "Expand", "Concat", "Split", "Slice", "Gather", "GatherElements",
        "GatherND", "Pad", "Tile", "Shape", "Size", "DepthToSpace", "SpaceToDepth", "Dropout",
    }
)  # fmt: skip
# Elementwise ops and the constant that makes each an identity (x + 0, x * 1, ...).
_NEUTRAL = {"Add": 0.0, "Sub": 0.0, "Mul": 1.0, "Div": 1.0}


class Constants:
    """The values a graph holds fixed (initializers, Constant nodes, and what Cast or Identity
    make of them: a Cast keeps which entries are zero or one, as far as `computes` asks), read
    on demand. A weight the graph was read without (tconform.models.read_graph drops large
    ones) is read from `path`, the file it came from, where the caller allows it."""

    def __init__(self, graph, path: Path | None = None) -> None:
        self._tensors = {t.name: t for t in graph.initializer}
        self._moved: dict[str, object] = {}  # a weight reshaped, transposed, expanded: its source
        self._dequantized: dict[str, list[str]] = {}  # DequantizeLinear of constants: its inputs
        for node in graph.node:
            source = node.input[0] if node.input else ""
            fixed = source in self._tensors or source in self._moved
            if node.op_type == "Constant":
                value = next((a.t for a in node.attribute if a.name == "value"), None)
                if value is not None:
                    self._tensors[node.output[0]] = value
            elif node.op_type in ("Cast", "Identity") and source in self._tensors:
                self._tensors[node.output[0]] = self._tensors[source]
            elif node.op_type in MOVES and fixed:
                self._moved[node.output[0]] = self._tensors.get(source, self._moved.get(source))
            elif node.op_type == "DequantizeLinear" and all(n in self._tensors for n in node.input):
                self._dequantized[node.output[0]] = list(node.input)
            elif node.input and all(n in self._tensors or n in self._moved for n in node.input):
                # computed from constants alone (w + 0, max(w, -inf), where(true, w, w)): still
                # the model's weights, whatever op made them
                held = [self._tensors.get(n, self._moved.get(n)) for n in node.input]
                largest = max(held, key=lambda tensor: math.prod(tensor.dims))
                self._moved.update(dict.fromkeys(node.output, largest))
        self._path = path
        self._file: dict | None = None

    def float32_weight(self, name: str) -> bool:
        """Whether `name` is a fixed value stored in float32 with more than one element, or one
        moved (reshaped, transposed, expanded) from such a value (a float16 weight Cast to
        float32 is stored in float16)."""
        from onnx import TensorProto

        tensor = self._tensors.get(name, self._moved.get(name))
        return (
            tensor is not None
            and tensor.data_type == TensorProto.FLOAT
            and math.prod(tensor.dims) > 1
        )

    def get(self, name: str, read: bool = False):
        """The array named `name`, or None (not fixed, or left out and not to be `read`); a
        DequantizeLinear of constants is its dequantized value."""
        from onnx import TensorProto, numpy_helper

        if name in self._dequantized:
            return self._dequantize(self._dequantized[name], read)
        tensor = self._tensors.get(name)
        if tensor is None:
            return None
        if not (tensor.raw_data or _typed_data(tensor)) and any(tensor.dims):  # not held here
            if not (read and self._path):
                return None
            if tensor.data_location != TensorProto.EXTERNAL:  # dropped by read_graph
                tensor = self._from_file().get(tensor.name, tensor)
        try:  # external data lies in the model's folder (tconform.models.check_external_data)
            return numpy_helper.to_array(tensor, str(self._path.parent) if self._path else "")
        except (ValueError, OSError):
            return None

    def _dequantize(self, inputs: list[str], read: bool):
        """(q - zero point) * scale, or None where a part is not held or does not broadcast
        (a scale per row, which only an axis attribute would place)."""
        parts = [self.get(name, read) for name in inputs]
        if any(part is None for part in parts):
            return None
        values, scale, zero = (*parts, 0)[:3]
        try:
            return (values.astype("float64") - zero) * scale
        except ValueError:
            return None

    def _from_file(self) -> dict:
        import onnx

        if self._file is None:
            model = onnx.load(str(self._path), load_external_data=False)
            self._file = {t.name: t for t in model.graph.initializer}
        return self._file


def _typed_data(tensor) -> bool:
    """Whether `tensor` holds its values in a typed field (float_data, int32_data, ...)."""
    return any(
        getattr(tensor, f) for f in ("float_data", "int32_data", "int64_data", "double_data")
    )


# A term below this share of its output's largest term is below the narrowest row's rounding
# (bfloat16 keeps 8 bits): a weight made of such terms beside one is no sum (eye plus noise).
NEGLIGIBLE = 2.0**-8


def sums_nothing(weight, axis: int) -> bool:
    """Whether each output of a product with this constant weight reads one input at most, but
    for terms NEGLIGIBLE beside it (an identity, a permutation, a diagonal, their signed,
    scaled or slightly perturbed forms): such a product adds no terms, so it rounds once and
    computes nothing a row is earned by. `axis` is the weight's axis summed over."""
    import numpy as np

    weight = np.abs(np.asarray(weight, dtype=np.float64))
    if weight.ndim < 2:
        return False
    largest = weight.max(axis=axis, keepdims=True)
    return bool(((weight > NEGLIGIBLE * largest).sum(axis=axis) <= 1).all())


def _followers(nodes, step: dict[int, object]) -> dict[int, object]:
    """{id of a node of `step`: the node of `step` that reads its output} where one reads it
    through Casts and Identities alone (`step`: the nodes a chain may hold, by id)."""
    made_by = {name: node for node in nodes for name in node.output}
    after: dict[int, object] = {}
    for node in nodes:
        if id(node) not in step:
            continue
        source = made_by.get(step[id(node)])
        while source is not None and source.op_type in ("Cast", "Identity"):
            source = made_by.get(source.input[0])
        if source is not None and id(source) in step:
            after[id(source)] = node
    return after


def cancelling(nodes, constants: Constants) -> set[int]:
    """The ids of nodes that follow one another (through Casts and Identities alone) and
    together compute nothing: MatMuls by constant (or dequantised constant) matrices whose
    product sums nothing (sums_nothing: an orthogonal Q and then its transpose, a Hadamard
    and its transpose), and Add, Sub, Mul and Div by constants whose composite is x itself
    (x + c - c, x * 2 * 0.5), though each alone computes."""
    import numpy as np

    weight, affine, reads = {}, {}, {}
    for node in nodes:
        if node.op_type == "MatMul" and len(node.input) == 2:
            found = constants.get(node.input[1], read=True)
            if found is not None and found.ndim == 2:
                weight[id(node)], reads[id(node)] = found.astype(np.float64), node.input[0]
        elif node.op_type in _NEUTRAL and len(node.input) == 2:
            held = [constants.get(name, read=True) for name in node.input]
            if (held[0] is None) != (held[1] is None):  # one constant, one value
                first = held[0] is not None
                affine[id(node)] = (node.op_type, first, (held[0] if first else held[1]))
                reads[id(node)] = node.input[1 if first else 0]
    cancelled: set[int] = set()
    for kind, nothing in ((weight, _products_nothing), (affine, _affine_nothing)):
        after = _followers(nodes, {k: name for k, name in reads.items() if k in kind})
        fed = {id(node) for node in after.values()}
        for head in (node for node in nodes if id(node) in after and id(node) not in fed):
            chain = [head]
            while id(chain[-1]) in after:
                chain.append(after[id(chain[-1])])
            for k in range(len(chain) - 1):  # every run of two steps or more, wherever it starts
                last = nothing([kind[id(n)] for n in chain[k:]])
                if last:
                    cancelled.update(id(n) for n in chain[k : k + last + 1])
    return cancelled


def _products_nothing(weights: list) -> int:
    """The last index at which the product of `weights` from the first sums nothing (0: at
    none past the first)."""
    import numpy as np

    product, last = weights[0], 0
    for k, following in enumerate(weights[1:], 1):
        if product.shape[1] != following.shape[0]:
            break
        product = product @ following
        product = product / max(float(np.abs(product).max()), 1e-300)  # finite, however long
        if np.isfinite(product).all() and sums_nothing(product, 0):
            last = k
    return last


def _affine_nothing(steps: list) -> int:
    """The last index at which the elementwise `steps` from the first compose to x itself
    (0: at none past the first)."""
    import numpy as np

    scale, shift, added, last = np.float64(1.0), np.float64(0.0), 0.0, 0
    for k, step in enumerate(steps):
        scale, shift, added = _affine(scale, shift, added, step)
        identity = np.allclose(scale, 1, atol=NEGLIGIBLE) and np.all(
            np.abs(shift) <= NEGLIGIBLE * max(added, 1e-300)
        )
        if k and identity:
            last = k
    return last


def _affine(scale, shift, added: float, step) -> tuple:
    """x -> scale * x + shift after one more elementwise `step` (op, constant first, constant),
    and the largest constant added so far (the scale a shift of 0 is judged at)."""
    import numpy as np

    op, first, c = step
    c = np.asarray(c, dtype=np.float64)
    largest = max(added, float(np.abs(c).max(initial=0.0)))
    with np.errstate(all="ignore"):
        if op == "Add":
            return scale, shift + c, largest
        if op == "Sub" and not first:
            return scale, shift - c, largest
        if op == "Sub":  # c - x
            return -scale, c - shift, largest
        if op == "Mul":
            return scale * c, shift * c, added
        if not first:  # x / c
            return scale / c, shift / c, added
    return np.float64(np.nan), np.float64(np.nan), added  # c / x: no longer affine


def computes(node, constants: Constants, inner: dict[str, int], read: bool = False) -> bool:
    """Whether `node` does arithmetic that decides a model's error: not a move (MOVES), not
    an elementwise op with its neutral constant (x + 0, x * 1), not a product that sums
    nothing (a constant weight per sums_nothing, or an inner size of 1: the outer product
    that rotary embeddings compute in float32 inside float16 models). No-op nodes in a narrow
    type around a float32 model would otherwise buy it the float16 row. `inner`: each tensor's
    last size where shape inference knows it; `read`: read weights the graph left out."""
    inputs = [constants.get(name, read) for name in node.input]
    if node.op_type in MOVES:
        return False
    if node.op_type == "MatMul" and node.input and inner.get(node.input[0]) == 1:
        return False
    if node.op_type in _NEUTRAL and len(inputs) == 2:
        neutral = _NEUTRAL[node.op_type]
        # Sub and Div are neutral only with the constant second
        tried = inputs[1:] if node.op_type in ("Sub", "Div") else inputs
        return not any(c is not None and (c == neutral).all() for c in tried)
    if node.op_type in ("MatMul", "Gemm") and len(inputs) >= 2:
        trans = {a.name: a.i for a in node.attribute}  # Gemm's transA/transB swap the axes
        summed = (-2 if trans.get("transA") else -1, -1 if trans.get("transB") else -2)
        return not any(
            c is not None and sums_nothing(c, axis)
            for c, axis in zip(inputs[:2], summed, strict=True)
        )
    if node.op_type == "Conv" and len(inputs) >= 2 and inputs[1] is not None:
        kernel = inputs[1]
        return not sums_nothing(kernel.reshape(kernel.shape[0], -1).T, 0)
    return True


# Ops whose output is zero where one of their inputs is (products, and what moves or reduces
# a zero); Sub of a value from itself is zero too.
_ZERO_IN_ZERO_OUT = frozenset({"Mul", "MatMul", "Einsum", "ReduceSum", "ReduceMean", "Neg",
                               "Relu"})  # fmt: skip
_SMALL = 4096  # constants of at most this many elements are read to see whether they are zero


def zeros(graph) -> set[str]:
    """Tensors of `graph` that are exactly zero whatever its inputs: constants of zeros (small
    ones, as held), ConstantOfShape of 0, x - x, and what a product, a move or a sum makes of a
    zero (Mul by one, MatMul of one, ...). MOVES pass their first input's zeros only."""
    from onnx import numpy_helper

    found: set[str] = set()
    for tensor in graph.initializer:
        held = 0 < math.prod(tensor.dims) <= _SMALL and (tensor.raw_data or _typed_data(tensor))
        if held and not numpy_helper.to_array(tensor).any():
            found.add(tensor.name)
    for node in graph.node:
        value = next((a.t for a in node.attribute if a.name == "value"), None)
        data = numpy_helper.to_array(value) if value is not None else None
        if node.op_type == "Constant" and data is not None and data.size <= _SMALL:
            zero = not data.any()
        elif node.op_type == "ConstantOfShape":
            zero = data is None or not data.any()
        elif node.op_type == "Sub" and len(node.input) == 2:
            zero = node.input[0] == node.input[1] or all(n in found for n in node.input)
        elif node.op_type in MOVES:
            zero = bool(node.input) and node.input[0] in found
        else:
            zero = node.op_type in _ZERO_IN_ZERO_OUT and any(n in found for n in node.input)
        if zero:
            found.update(o for o in node.output if o)
    return found

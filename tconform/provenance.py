"""Provenance: which exact bytes a result ran, so that no pass is ever detached from its model.

Every result names its model's path, sha256 and origin:
  exported  written by tconform in this run
  cached    written by tconform earlier, recorded in its manifest, bytes unchanged
  given     a file the user named (read-only: never exported over, rewritten or deleted)
  module    a PyTorch module run in eager mode (path: its class; sha256: of its weights)
  oracle    the float64 NumPy oracle (path: its function; sha256: of the weights it was given)
  derived   a temporary file tconform made from the model under test (localisation's copy
            that returns boundary tensors, a subgraph cut out of it)
For ONNX files it also records what the file says of itself: producer, opset imports, IR version,
the element type of its inputs and outputs, and the one most of its operations take.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tconform.noops import Constants, cancelling, computes, sums_nothing, zeros

ORIGINS = ("exported", "cached", "given", "module", "oracle", "derived")

_ELEM_TYPES = {1: "float32", 10: "float16", 16: "bfloat16", 11: "float64"}


# The rows of models that compute in a narrower type than float32, narrowest last.
NARROW = ("float16", "bfloat16")
# The compute types of quantised graphs (compute_type).
QUANTIZED_TYPES = ("int8", "int4")


@dataclass(frozen=True)
class ModelProvenance:
    path: str
    sha256: str
    origin: str
    producer: str = ""
    opsets: dict[str, int] = field(default_factory=dict)
    ir_version: int | None = None
    elem_type: str = ""  # of its floating-point inputs and outputs
    compute_elem_type: str = ""  # the type its live operations take ("int8": quantised)
    compute_note: str = ""  # why, where its live compute mixes precisions
    external_data: dict[str, str] = field(default_factory=dict)  # location -> sha256

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @property
    def precision(self) -> str:
        """The row the model earns, by what reaches its outputs (dead nodes and weights do not
        count; compute_type): int8 (int4) when its live weights are int8 (4-bit) read by
        quantised ops (onnxruntime.quantization's graphs); float16 or bfloat16 when its inputs
        and outputs are, or its live operations take that type (a conversion that kept float32
        inputs and outputs); float16 weights Cast back to float32, or a Cast pair, do not
        loosen it, and live compute that mixes precisions takes the stricter row."""
        compute = self.compute_elem_type
        if compute in QUANTIZED_TYPES:
            return compute
        io_type = self.elem_type or "float32"
        for narrow in NARROW:
            if narrow in (io_type, compute):
                return narrow
        return io_type

    @property
    def short(self) -> str:
        """'path (given, sha256 1a2b3c4d)': the form the terminal table prints."""
        return f"{self.path} ({self.origin}, sha256 {self.sha256[:12]})"


def onnx_provenance(path: Path, origin: str, sha256: str, model) -> ModelProvenance:
    """What an ONNX file records of itself (`model`: its graph, as tconform.models.read_graph
    gives it: weights left out, since shape inference serializes the whole model)."""
    elem_type = ""
    for value in (*model.graph.input, *model.graph.output):
        elem_type = _ELEM_TYPES.get(value.type.tensor_type.elem_type, "")
        if elem_type:
            break
    producer = " ".join(p for p in (model.producer_name, model.producer_version) if p)
    compute, why = compute_type(model, path)
    return ModelProvenance(
        path=str(path),
        sha256=sha256,
        origin=origin,
        producer=producer,
        opsets={o.domain or "ai.onnx": o.version for o in model.opset_import},
        ir_version=model.ir_version,
        elem_type=elem_type,
        compute_elem_type=compute,
        compute_note=why,
    )


# Ops that read quantised (8-bit or 4-bit) tensors: ONNX's and ONNX Runtime's contrib ops that
# onnxruntime.quantization writes (dynamic, static QOperator and QDQ formats, and the 4-bit
# weight-only MatMulNBits / GatherBlockQuantized).
QUANTIZED_OPS = {
    "MatMulInteger",
    "ConvInteger",
    "DequantizeLinear",
    "QLinearMatMul",
    "QLinearConv",
    "DynamicQuantizeMatMul",
    "MatMulIntegerToFloat",
    "QAttention",
    "QGemm",
    "QEmbedLayerNormalization",
    "MatMulNBits",
    "GatherBlockQuantized",
    "DynamicQuantizeLSTM",  # quantize_dynamic's LSTM: its weights int8
}
_INT8_TYPES = {2, 3}  # UINT8, INT8
_INT4_TYPES = {21, 22}  # UINT4, INT4 (QDQ)
# Ops whose uint8 weight packs two 4-bit values per byte (their `bits` attribute, default 4).
_PACKED_OPS = {"MatMulNBits", "GatherBlockQuantized"}
# Ops that copy a float table's rows as they are (an embedding lookup, a slice of a positional
# table): a float table only these read computes nothing, so it does not make a model whose
# products are quantised (an int4 export keeps its embedding tables float32) a float model.
_LOOKUP_OPS = {"Gather", "GatherElements", "GatherND", "Slice"}
# Weights: initializers of two or more dimensions (matrices, kernels, tables). A scale or zero
# point has one element, or one per channel; a bias, a norm's gain or a Reshape's shape is 1-D.
# (A size threshold left out the whole of a small model: its int8 graph was judged float32.)
_WEIGHT_RANK = 2


@dataclass
class Live:
    """What a graph's outputs depend on: the nodes that compute them (with the live nodes of
    the If/Loop/Scan bodies they run), every tensor name those read, and the initializers
    among them. A node whose outputs go nowhere, and a weight only it reads, are dead: they
    compute nothing a result is judged on."""

    nodes: list = field(default_factory=list)
    names: set[str] = field(default_factory=set)
    initializers: list = field(default_factory=list)


def _bodies(node) -> list:
    """The graphs a control-flow node runs (If's branches, Loop's and Scan's body)."""
    from onnx import AttributeProto

    bodies = []
    for attribute in node.attribute:
        if attribute.type == AttributeProto.GRAPH:
            bodies.append(attribute.g)
        elif attribute.type == AttributeProto.GRAPHS:
            bodies.extend(attribute.graphs)
    return bodies


def live_part(graph) -> Live:
    """Backward reachability from `graph`'s outputs through node inputs; a live node's bodies
    are walked the same way from their own outputs, and the outer names they read are live.
    A value that is zero whatever the inputs (tconform.noops.zeros: x * 0, x - x) is a
    constant: what made it is not live (a decoy weight multiplied by zero buys no row)."""
    producer = {name: k for k, node in enumerate(graph.node) for name in node.output if name}
    always_zero = zeros(graph)
    live = Live()
    pending = [value.name for value in graph.output]
    reached: set[int] = set()
    while pending:
        name = pending.pop()
        if name in live.names:
            continue
        live.names.add(name)
        k = producer.get(name)
        if k is None or k in reached or name in always_zero:
            continue
        reached.add(k)
        node = graph.node[k]
        pending += [i for i in node.input if i]
        for body in _bodies(node):
            inner = live_part(body)
            live.nodes += inner.nodes
            live.initializers += inner.initializers
            pending += inner.names  # names of the body's own never match an outer producer
    live.nodes = [graph.node[k] for k in sorted(reached)] + live.nodes
    live.initializers = [t for t in graph.initializer if t.name in live.names] + live.initializers
    return live


def quantized_elements(model, path: Path | None = None, ignored=frozenset()) -> dict[str, int]:
    """Weight elements that reach `model`'s outputs by how they are held: "int8" (int8/uint8
    read by a quantised op), "int4" (4-bit: packed two to a byte for MatMulNBits, or an int4
    tensor), "float". Dead weights do not count, nor do float tables that are only looked up
    (_LOOKUP_OPS): their rows enter the compute exactly, nor quantised weights that sum
    nothing (an int8 identity would buy a float32 model the int8 row). `path`: the file, for
    weights the graph was read without."""
    live = live_part(model.graph)
    constants = Constants(model.graph, path)
    readers: dict[str, set[str]] = {}
    zero_point: dict[str, str] = {}  # a quantised weight -> the name of its zero point
    bits: dict[str, int] = {}
    for node in live.nodes:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
        if node.op_type == "DequantizeLinear" and len(node.input) > 2:
            zero_point[node.input[0]] = node.input[2]
        if node.op_type in _PACKED_OPS and len(node.input) > 1:
            width = next((a.i for a in node.attribute if a.name == "bits"), 4)
            bits[node.input[0 if node.op_type == "GatherBlockQuantized" else 1]] = width
    looked_up = {name for name, ops in readers.items() if ops <= _LOOKUP_OPS}
    # An int8 embedding table is gathered first and its rows dequantised after (the quantiser's
    # Gather -> DequantizeLinear): a Gather's readers read its table too.
    for node in live.nodes:
        if node.op_type == "Gather" and node.output:
            readers[node.input[0]] |= readers.get(node.output[0], set())
    counts = {"int8": 0, "int4": 0, "float": 0}
    for tensor in live.initializers:
        if len(tensor.dims) < _WEIGHT_RANK:
            continue
        count = 1
        for dim in tensor.dims:
            count *= dim
        quantized = readers.get(tensor.name, set()) & QUANTIZED_OPS
        if tensor.name in ignored or (
            quantized and _quantized_no_op(tensor.name, zero_point, constants)
        ):
            continue
        if quantized and tensor.data_type in _INT4_TYPES:
            counts["int4"] += count
        elif quantized and tensor.data_type in _INT8_TYPES and bits.get(tensor.name) == 4:
            counts["int4"] += 2 * count
        elif quantized and tensor.data_type in _INT8_TYPES:
            counts["int8"] += count
        elif tensor.name not in looked_up and tensor.data_type in _ELEM_TYPES:
            counts["float"] += count  # (an integer weight no op here reads as int8 is neither)
    return counts


def _quantized_no_op(name: str, zero_point: dict[str, str], constants: Constants) -> bool:
    """Whether the quantised weight `name`, less its zero point, sums nothing (sums_nothing
    along either axis: an identity, a permutation, a diagonal)."""
    import numpy as np

    values = constants.get(name, read=True)
    if values is None or values.ndim != _WEIGHT_RANK or values.dtype.kind not in "iu":
        return False  # packed 4-bit, or not held: counted as it is
    zero = constants.get(zero_point.get(name, ""), read=True)
    try:
        centred = values.astype(np.int64) - (zero.astype(np.int64) if zero is not None else 0)
    except ValueError:  # a zero point per row: none here is an identity's
        return False
    return sums_nothing(centred, 0) or sums_nothing(centred, 1)


def _quantized(model, path: Path | None = None, ignored=frozenset()) -> tuple[float, str]:
    """(the quantised share of the live weights, "int4" where most of those are 4-bit else
    "int8"); `ignored`: weights of products that together compute nothing."""
    counts = quantized_elements(model, path, ignored)
    total = sum(counts.values())
    share = (counts["int8"] + counts["int4"]) / total if total else 0.0
    return share, "int4" if counts["int4"] > counts["int8"] else "int8"


def quantized_share(model) -> float:
    """The share of the weight elements that reach `model`'s outputs held as int8 or int4 and
    read by a quantised op (0 for a float model): a graph onnxruntime.quantization made holds
    most of its weights so. Dead weights do not count."""
    return _quantized(model)[0]


# A precision with less than this share of a model's live compute (its weight elements for
# int8, its node inputs for a float type) does not make the model mixed: the float32 Casts at the
# inputs of a float16 conversion that kept float32 inputs, the biases an int8 quantiser leaves.
# One with more is live; a model computing in two live precisions is judged by the stricter row.
MIXED_SHARE = 0.25
# A model whose live weights are mostly int8 is an int8 model: the int8 part's error is its
# outputs' error, and the float rest computes more precisely (the int8 row's SQNR floor sees an
# error that moves a whole output). ONNX Runtime's quantiser leaves float, say, the sliced input
# projections of nn.MultiheadAttention: a quarter of such a model, which is still int8.
INT8_SHARE = 0.5
# The precisions, strictest row first (the model rows' atol: 1e-5, 6e-2, 0.15, 0.4; float64
# has no row, and stays strictest).
STRICTNESS = ("float64", "float32", "float16", "bfloat16", "int8", "int4")


# The ops whose rounding dominates a model's error (long sums of products): where any reaches
# the outputs, their input types decide the float type it computes in. A float16 conversion
# keeps elementwise ops (Min, Max, CumSum, Range, Resize) in float32 around float16 products;
# those do not make its error float32's.
MATRIX_PRODUCTS = frozenset(
    {
        "MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "Attention", "LSTM", "GRU", "RNN",
        # ONNX Runtime's fused forms (its optimiser's output, com.microsoft)
        "FusedMatMul", "FusedGemm", "FusedConv", "MultiHeadAttention", "GroupQueryAttention",
    }
)  # fmt: skip
# Ops that compute with a model's constants (its weights, gains, biases). One in float32 that
# reads a float32 constant of more than one element is the model's own float32 compute: however
# many narrower nodes sit beside it (a rotation and its transpose, x + c - c), the model keeps
# the float32 row. A float16 conversion holds its constants in float16 but for the ops it leaves
# float32 (ranges, clamps, resizes: none of these); a float16 model's own float32 arithmetic
# reads scalars (Llama's RMSNorm epsilon) or its float16 weights Cast up (Gemma's norm gain).
WEIGHTED = MATRIX_PRODUCTS | {
    "Add", "Sub", "Mul", "Div", "PRelu", "LayerNormalization", "SimplifiedLayerNormalization",
    "SkipLayerNormalization", "SkipSimplifiedLayerNormalization", "RMSNormalization",
    "BatchNormalization", "InstanceNormalization", "GroupNormalization",
}  # fmt: skip


def _votes(nodes, types: dict[str, int]) -> Counter:
    """How many of `nodes`' inputs have each float type."""
    return Counter(
        _ELEM_TYPES[types[name]]
        for node in nodes
        for name in node.input
        if types.get(name) in _ELEM_TYPES
    )


def compute_type(model, path: Path | None = None) -> tuple[str, str]:
    """The type `model` computes in ('' when none is known) and, where its live compute mixes
    precisions, why it is judged by the stricter one. Only what reaches the outputs counts, and
    of that only nodes that compute (`computes`: no moves, Casts or no-op products). It is
    "int8" ("int4") when its weights are int8 (4-bit) read by quantised ops; otherwise the
    float type its computing nodes' inputs have. A float16 conversion that kept float32 inputs
    and outputs computes in float16, while float16 weights Cast back to float32 leave it
    float32. The float type is that of its matrix products' inputs (MATRIX_PRODUCTS), or of
    every computing node's where no product reaches the outputs. Where int8 weights hold
    between MIXED_SHARE and INT8_SHARE of it, or a second float type at least MIXED_SHARE, the
    model is mixed and takes the stricter row; a float32 product that reaches the outputs
    always keeps the float32 row (its rounding is what the outputs carry, however many
    narrower products sit beside it). `path`: the file `model` was read from, where weights
    it was read without may be read."""
    import onnx
    from onnx import TensorProto

    graph = model.graph
    constants = Constants(graph, path)
    live_nodes = live_part(graph).nodes
    cancelled = cancelling(live_nodes, constants)
    dequantized = {n.output[0]: n.input[0] for n in live_nodes if n.op_type == "DequantizeLinear"}
    ignored = {
        dequantized[name]
        for n in live_nodes
        if id(n) in cancelled
        for name in n.input
        if name in dequantized
    }
    share, quantized = _quantized(model, path, ignored)
    if share > INT8_SHARE:
        return quantized, ""

    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # an op ONNX's inference rejects: what the file itself states is enough
        graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.value_info)}
    types.update({t.name: t.data_type for t in graph.initializer})
    for node in live_nodes:  # Casts say their output type even where inference stopped
        if node.op_type == "Cast":
            types[node.output[0]] = next((a.i for a in node.attribute if a.name == "to"), 0)
    inner = {}
    for value in (*graph.input, *graph.value_info):
        dims = value.type.tensor_type.shape.dim
        if dims and dims[-1].HasField("dim_value"):
            inner[value.name] = dims[-1].dim_value
    # a narrow node must earn its row: its weights are read even where the graph left them out
    narrow = {code for code, name in _ELEM_TYPES.items() if name in NARROW}
    in_narrow = {id(n) for n in live_nodes if any(types.get(i) in narrow for i in n.input)}
    nodes = [
        node
        for node in live_nodes
        if id(node) not in cancelled
        and computes(node, constants, inner, read=id(node) in in_narrow)
    ]
    products = [node for node in nodes if node.op_type in MATRIX_PRODUCTS]
    votes = _votes(products, types)
    counted = "matrix products' inputs"
    if not votes:  # no live matrix product: every computing node's inputs have their say
        votes, counted = _votes(nodes, types), "node inputs"
    total = sum(votes.values())
    live = {t: n / total for t, n in votes.items() if n / total >= MIXED_SHARE}
    if counted.startswith("matrix") and votes.get("float32"):
        live["float32"] = votes["float32"] / total
    if share >= MIXED_SHARE:
        live[quantized] = share
    own = Counter(
        node.op_type
        for node in nodes
        if node.op_type in WEIGHTED
        and any(
            constants.float32_weight(name)
            and types.get(name, TensorProto.FLOAT) == TensorProto.FLOAT
            for name in node.input
        )
    )
    if own:
        live.setdefault("float32", votes.get("float32", 0) / total if total else 0.0)
    if not live:
        return (votes.most_common(1)[0][0] if votes else ""), ""
    chosen = min(live, key=STRICTNESS.index)
    if len(live) == 1:
        return chosen, ""
    parts = [
        f"{t} {live[t]:.0%} of its {'weights' if t in ('int8', 'int4') else counted}"
        for t in sorted(live, key=STRICTNESS.index)
        if live[t] > 0  # float32 live by its weights alone: said below
    ]
    if own:
        ops = ", ".join(f"{op} x{n}" for op, n in sorted(own.items()))
        parts.append(f"float32 weights read by {ops}")
    why = (
        f"mixed precision in what reaches the outputs ({', '.join(parts)}): judged by the "
        f"stricter {chosen} row"
    )
    return chosen, why


def _weights_sha256(named_arrays) -> str:
    """sha256 over each weight's name and bytes, in the order given."""
    digest = hashlib.sha256()
    for name, array in named_arrays:
        digest.update(name.encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def module_provenance(module, dtype: str = "float32") -> ModelProvenance:
    """A PyTorch module: its class, and a digest of what decides what it computes: each
    submodule's path, class and settings (`extra_repr`: a norm's eps, a convolution's stride),
    and every parameter and buffer (persistent or not), by name. Two different modules without
    weights differ (ReLU and GELU, LayerNorm at two eps)."""
    import torch

    digest = hashlib.sha256()
    for path, sub in module.named_modules():
        kind = type(sub)
        digest.update(f"{path}:{kind.__module__}.{kind.__qualname__}({sub.extra_repr()})".encode())
    for name, tensor in (*module.named_parameters(), *module.named_buffers()):
        digest.update(name.encode())
        flat = tensor.detach().cpu().contiguous().flatten()
        digest.update(flat.view(torch.uint8).numpy())  # any dtype, bfloat16 too; no copy
    cls = type(module)
    return ModelProvenance(
        path=f"{cls.__module__}.{cls.__qualname__}",
        sha256=digest.hexdigest(),
        origin="module",
        elem_type=dtype,
    )


def oracle_provenance(function, params: dict) -> ModelProvenance:
    """The float64 oracle: its function, and a digest of the weights it ran with, by name."""
    return ModelProvenance(
        path=f"{function.__module__}.{function.__qualname__}",
        sha256=_weights_sha256((name, params[name]) for name in sorted(params)),
        origin="oracle",
        elem_type="float64",
    )

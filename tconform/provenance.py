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

ORIGINS = ("exported", "cached", "given", "module", "oracle", "derived")

_ELEM_TYPES = {1: "float32", 10: "float16", 16: "bfloat16", 11: "float64"}


@dataclass(frozen=True)
class ModelProvenance:
    path: str
    sha256: str
    origin: str
    producer: str = ""
    opsets: dict[str, int] = field(default_factory=dict)
    ir_version: int | None = None
    elem_type: str = ""  # of its floating-point inputs and outputs
    compute_elem_type: str = ""  # the type most of its operations take ("int8": quantised)
    external_data: dict[str, str] = field(default_factory=dict)  # location -> sha256

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

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
    return ModelProvenance(
        path=str(path),
        sha256=sha256,
        origin=origin,
        producer=producer,
        opsets={o.domain or "ai.onnx": o.version for o in model.opset_import},
        ir_version=model.ir_version,
        elem_type=elem_type,
        compute_elem_type=compute_type(model),
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
}
_INT8_TYPES = {2, 3}  # UINT8, INT8
_INT4_TYPES = {21, 22}  # UINT4, INT4 (QDQ)
# Ops whose uint8 weight packs two 4-bit values per byte (their `bits` attribute, default 4).
_PACKED_OPS = {"MatMulNBits", "GatherBlockQuantized"}
# Weights: initializers of more elements than this (a scale or zero point is one, or one per
# channel; a Reshape's shape a few).
_WEIGHT_ELEMENTS = 64


# A model whose weights are mostly int8 (or int4) is an int8 (int4) model: its tolerance row.
INT8_SHARE = 0.5


def quantized_elements(model) -> dict[str, int]:
    """Weight elements of `model` by how they are held: "int8" (int8/uint8 read by a quantised
    op), "int4" (4-bit: packed two to a byte for MatMulNBits, or an int4 tensor), "float"."""
    readers: dict[str, set[str]] = {}
    bits: dict[str, int] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
        if node.op_type in _PACKED_OPS and len(node.input) > 1:
            width = next((a.i for a in node.attribute if a.name == "bits"), 4)
            bits[node.input[0 if node.op_type == "GatherBlockQuantized" else 1]] = width
    # An int8 embedding table is gathered first and its rows dequantised after (the quantiser's
    # Gather -> DequantizeLinear): a Gather's readers read its table too.
    for node in model.graph.node:
        if node.op_type == "Gather" and node.output:
            readers[node.input[0]] |= readers.get(node.output[0], set())
    counts = {"int8": 0, "int4": 0, "float": 0}
    for tensor in model.graph.initializer:
        count = 1
        for dim in tensor.dims:
            count *= dim
        if count <= _WEIGHT_ELEMENTS:
            continue
        quantized = readers.get(tensor.name, set()) & QUANTIZED_OPS
        if quantized and tensor.data_type in _INT4_TYPES:
            counts["int4"] += count
        elif quantized and tensor.data_type in _INT8_TYPES and bits.get(tensor.name) == 4:
            counts["int4"] += 2 * count
        elif quantized and tensor.data_type in _INT8_TYPES:
            counts["int8"] += count
        else:
            counts["float"] += count
    return counts


def quantized_share(model) -> float:
    """The share of `model`'s weight elements held as int8 or int4 and read by a quantised op
    (0 for a float model): a graph onnxruntime.quantization made holds most of its weights so."""
    counts = quantized_elements(model)
    total = sum(counts.values())
    return (counts["int8"] + counts["int4"]) / total if total else 0.0


def quantized_type(model) -> str | None:
    """ "int8" or "int4" when most of `model`'s weights are quantised (the narrower type where
    most of the quantised ones are 4-bit), None otherwise."""
    counts = quantized_elements(model)
    total = sum(counts.values())
    if not total or (counts["int8"] + counts["int4"]) / total <= INT8_SHARE:
        return None
    return "int4" if counts["int4"] >= counts["int8"] else "int8"


def compute_type(model) -> str:
    """The type `model` computes in ('' when none is known): "int8" or "int4" when most of its
    weights are quantised (quantized_type); otherwise the float type most of its node inputs
    have. A float16 conversion that kept float32 inputs and outputs computes in float16, while
    float16 weights Cast back to float32, or a Cast pair in between, leave it float32."""
    import onnx

    quantized = quantized_type(model)
    if quantized:
        return quantized

    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:  # an op ONNX's inference rejects: what the file itself states is enough
        graph = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*graph.input, *graph.value_info)}
    types.update({t.name: t.data_type for t in graph.initializer})
    for node in graph.node:  # Casts say their output type even where inference stopped
        if node.op_type == "Cast":
            types[node.output[0]] = next((a.i for a in node.attribute if a.name == "to"), 0)
    votes = Counter(
        _ELEM_TYPES[types[name]]
        for node in graph.node
        for name in node.input
        if types.get(name) in _ELEM_TYPES
    )
    return votes.most_common(1)[0][0] if votes else ""


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

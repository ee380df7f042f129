"""Where a float16 model holds a mask fill that half precision cannot represent.

float16's largest finite magnitude is 65504. A mask fill of -1e9 (document 002's masked_fill)
becomes -inf when the exporter stores it in half precision, exactly as the -inf fill of the
paper's variant does. Masking with -inf is harmless while a softmax row keeps one unmasked
score, but a fully masked row is all -inf, exp(-inf - max) = exp(nan), and the row comes out NaN
where the float32 -1e9 model returns uniform weights (the mean of V). This module finds those
constants so a report can name them; docs/cuda.md explains the consequence.

It also says which ops ONNX Runtime's CPU provider really computes in float32: where the CPU
provider has no float16 kernel, ONNX Runtime does not fail but wraps the node in Casts to float32
(its InsertCastTransformer), so a "float16" CPU run is mostly a float32 computation.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, numpy_helper

FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504


@dataclass(frozen=True)
class OverflowingConstant:
    """A constant whose values are, or will become, infinite or saturated in float16."""

    name: str  # initializer name, or the node that holds it as an attribute
    where: str  # "initializer" or "<OpType> attribute"
    dtype: str  # the stored element type
    value: float  # the most negative (or largest) offending value as stored
    count: int  # how many elements of the tensor offend
    consumers: tuple[str, ...]  # op types that read it (e.g. Where: a mask fill)

    def describe(self) -> str:
        users = ", ".join(self.consumers) or "no node"
        stored = f"{self.name} ({self.where}, {self.dtype})"
        return f"{stored} holds {self.value} x{self.count}, read by {users}"


def _offending(array: np.ndarray) -> np.ndarray:
    """Elements that are infinite or outside float16's finite range (at or beyond +-65504)."""
    values = array.astype(np.float64)
    return ~np.isfinite(values) | (np.abs(values) >= FLOAT16_MAX)


def _found(name: str, where: str, array: np.ndarray, consumers: tuple[str, ...]):
    if array.dtype.kind != "f" or array.size == 0:
        return None
    bad = _offending(array)
    if not bad.any():
        return None
    values = array[bad].astype(np.float64)
    worst = values[np.argmax(np.abs(np.nan_to_num(values, posinf=np.inf, neginf=np.inf)))]
    return OverflowingConstant(
        name, where, str(array.dtype), float(worst), int(bad.sum()), consumers
    )


def find_overflowing_constants(model: onnx.ModelProto | Path | str) -> list[OverflowingConstant]:
    """Every initializer and constant attribute (top-level graph) that is infinite, saturated
    at +-65504, or too large for float16 (a float32 -1e9 that a Cast would turn into -inf)."""
    if not isinstance(model, onnx.ModelProto):
        model = onnx.load(str(model))
    graph = model.graph
    readers: dict[str, list[str]] = {}
    for node in graph.node:
        for tensor_name in node.input:
            readers.setdefault(tensor_name, []).append(node.op_type)

    found: list[OverflowingConstant | None] = []
    for init in graph.initializer:
        consumers = tuple(sorted(set(readers.get(init.name, []))))
        found.append(_found(init.name, "initializer", numpy_helper.to_array(init), consumers))
    for node in graph.node:
        for attr in node.attribute:
            if attr.type != onnx.AttributeProto.TENSOR:
                continue
            consumers = tuple(sorted({op for out in node.output for op in readers.get(out, [])}))
            array = numpy_helper.to_array(attr.t)
            found.append(
                _found(node.name or node.output[0], f"{node.op_type} attribute", array, consumers)
            )
    return [f for f in found if f is not None and not _held_mask_fill(f)]


def _held_mask_fill(found: OverflowingConstant) -> bool:
    """A float16 mask fill at float16's lowest value (what converters and transformers' float16
    masks use for -1e9 or float32's lowest): finite, so a fully masked row still gives uniform
    weights as in float32; nothing to say."""
    return (
        found.dtype == "float16" and found.value == -FLOAT16_MAX and found.consumers == ("Where",)
    )


def ops_run_in_float32(model_path: Path | str) -> dict[str, int]:
    """{op type: node count} of a float16 model's nodes that ONNX Runtime's CPU provider runs
    in float32 (it has no float16 kernel for them and inserted Casts around them).

    Read from the graph ONNX Runtime itself saves after its required rewrites (optimisations
    off, so only the Cast insertion changes the graph), with ONNX shape inference giving each
    node's output type.
    """
    given = onnx.load(str(model_path), load_external_data=False)
    # nodes the file itself computes in float32 (a converter's kept ones): ONNX Runtime inserted
    # nothing around them, and keeps their names
    in_file = {node.name for node in _float32_nodes(given) if node.name}
    with tempfile.TemporaryDirectory() as tmp:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        options.optimized_model_filepath = str(Path(tmp) / "as_run.onnx")
        options.log_severity_level = 3
        ort.InferenceSession(str(model_path), options, providers=["CPUExecutionProvider"])
        as_run = onnx.load(options.optimized_model_filepath)
    return dict(Counter(n.op_type for n in _float32_nodes(as_run) if n.name not in in_file))


def _float32_nodes(model) -> list:
    """`model`'s nodes other than Casts with a float32 output (by ONNX shape inference, from
    the graph's inputs and initializers alone: a converter can leave value_info that no longer
    says what a node computes, which inference would refuse as a contradiction)."""
    bare = onnx.ModelProto()
    bare.CopyFrom(model)
    del bare.graph.value_info[:]
    graph = onnx.shape_inference.infer_shapes(bare).graph
    elem_types = {
        value.name: value.type.tensor_type.elem_type
        for value in (*graph.value_info, *graph.input, *graph.output)
    }
    elem_types.update({t.name: t.data_type for t in graph.initializer})
    return [
        node
        for node in graph.node
        if node.op_type != "Cast"
        and any(elem_types.get(out) == TensorProto.FLOAT for out in node.output)
    ]


def float16_notes(model_path: Path, ep: str) -> list[str]:
    """What a float16 run of this model should be read with: mask fills that half precision
    turned into -inf (and what that does to a fully masked row), and on the CPU provider the
    ops it computed in float32 for want of a float16 kernel."""
    notes = []
    for found in find_overflowing_constants(model_path):
        if found.value == float("-inf") and "Where" in found.consumers:
            notes.append(
                f"float16 mask fill: {found.describe()}; -1e9 is -inf in half precision, so a "
                "fully masked attention row is NaN (float32 with a -1e9 fill: uniform weights)"
            )
        else:
            notes.append(f"float16 overflow: {found.describe()}")
    if ep == "cpu":
        in_float32 = ops_run_in_float32(model_path)
        if in_float32:
            ops = ", ".join(f"{op} x{n}" for op, n in sorted(in_float32.items()))
            notes.append(
                "the CPU provider has no float16 kernel for these ops and ran them in float32 "
                f"between inserted Casts: {ops}"
            )
    return notes

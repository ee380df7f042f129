"""A user's model in a reduced precision, made with the field's own tools from its float32
export, as a user of ONNX Runtime would make it:
  float16   onnxruntime.transformers.float16.convert_float_to_float16, keep_io_types=True (the
            inputs and outputs stay float32; Casts at the edges);
  int8      onnxruntime.quantization.quantize_dynamic (tconform.export.quantize: int8 weights,
            activations quantised per call);
  bfloat16  not a conversion: the module itself exported in bfloat16 (tconform.suites.module);
  float16-planned, int8-planned  the same converters, leaving in float32 the nodes of the
            modules a precision plan names (tconform.module_check.precision_plan).
Nodes a converter adds carry no module scope; each takes the scope its consumers share
(tconform.export.quantize.restore_scopes), so localisation places them in their module.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from tconform.config import PLANNED_DTYPES
from tconform.errors import UsageError, first_line
from tconform.export.quantize import quantize_int8, quiet_quantizer, restore_scopes
from tconform.files import atomic_write_bytes

CONVERTED = ("float16", "int8")  # made from the float32 export; the others exported
# with PLANNED_DTYPES, converted with a precision plan (tconform.module_check.precision_plan)
DTYPES = ("float32", "float16", "bfloat16", "int8", *PLANNED_DTYPES)  # a user's model's dtype axis


class ConversionFailed(UsageError):
    """The converter failed on a float32 export: the verdict of the cells of that dtype (an
    error row each), not the end of the run."""


def convert(base: Path, dtype: str, target: Path, keep: Sequence[str] = ()) -> tuple[str, ...]:
    """The float32 model `base` converted to `dtype` (one of CONVERTED), written to `target`;
    the nodes named in `keep` stay float32 (the converter's node_block_list, the quantiser's
    nodes_to_exclude: a precision plan's, tconform.module_check.precision_plan). Returns what
    the conversion changed beyond rounding (notes: weights float16 cannot hold). A converter
    that fails is ConversionFailed, one line naming it."""
    tool = "quantize_dynamic" if dtype == "int8" else "convert_float_to_float16"
    try:
        if dtype == "int8":
            quantize_int8(base, target, exclude=keep)
            return ()
        with quiet_quantizer():  # the converter logs on the root logger too
            float32 = onnx.load(str(base))
            clamped = clamped_weights(float32, keep)
            model = _float16(float32, keep)
    except Exception as exc:
        why = first_line(exc)
        raise ConversionFailed(f"ONNX Runtime's {tool} failed on {base}: {why}") from None
    restore_scopes(model.graph)
    atomic_write_bytes(target, model.SerializeToString())
    return (clamped,) if clamped else ()


# What convert_float_to_float16 clamps a weight to (its min_positive_val and max_finite_val)
FLOAT16_SMALLEST, FLOAT16_LARGEST = 5.96e-08, 65504.0
CLAMPED_SHARE = 0.01  # of a weight's nonzero values: a few by chance are rounding, not a change
# Magnitudes from here on are mask fills (-1e9, a type's minimum), not weights or activations:
# clamped to float16's largest they still mask (exp(-65504 - max) is 0), so they change nothing
MASK_FILL = 1e9
FLOAT16_NORMAL = 6.103515625e-05  # float16's smallest normal: below it each halving loses a bit
COARSE = 0.05  # a subnormal that moves by more than this share of itself is changed, not rounded
# (an RMSNorm epsilon of 1e-6 moves 1.3 %, which changes nothing; 1e-7 moves 19 %)


def clamped_weights(model: onnx.ModelProto, keep: Sequence[str] = ()) -> str:
    """Which float32 weights and constants the float16 conversion changes beyond rounding
    (where more than a few values by chance): a magnitude below float16's smallest raised to
    5.96e-8 or one above its largest lowered to 65504 (the converter clamps them), and one
    among float16's subnormals (below 6.1e-5) that keeps so few bits that it moves by over
    COARSE of itself (mask fills, MASK_FILL and beyond, left out: they still mask).
    No float16 tolerance row covers either. '' where none."""
    kept = set(keep)
    read = {name for n in model.graph.node if n.name not in kept for name in n.input}
    weights = [(init.name, init) for init in model.graph.initializer if init.name in read] + [
        (n.output[0], a.t)
        for n in model.graph.node
        if n.op_type == "Constant" and n.name not in kept
        for a in n.attribute
        if a.name == "value"
    ]
    clamped, coarse = [], []
    for name, tensor in weights:
        if tensor.data_type != onnx.TensorProto.FLOAT:
            continue
        magnitude = np.abs(numpy_helper.to_array(tensor)).astype(np.float32)
        nonzero = max(1, int(np.count_nonzero(magnitude)))
        beyond = int(((magnitude > 0) & (magnitude < FLOAT16_SMALLEST)).sum())
        beyond += int(((magnitude > FLOAT16_LARGEST) & (magnitude < MASK_FILL)).sum())
        subnormal = magnitude[(magnitude >= FLOAT16_SMALLEST) & (magnitude < FLOAT16_NORMAL)]
        with np.errstate(over="ignore"):
            moved = np.abs(subnormal.astype(np.float16).astype(np.float32) - subnormal)
        off = int((moved > COARSE * subnormal).sum())
        if beyond and beyond >= CLAMPED_SHARE * nonzero:
            clamped.append(f"{name} ({beyond} of {nonzero})")
        if off and off >= CLAMPED_SHARE * nonzero:
            coarse.append(f"{name} ({off} of {nonzero})")
    said = []
    if clamped:
        said.append(
            f"weights beyond float16's range were clamped to +-{FLOAT16_SMALLEST:g} or "
            f"+-{FLOAT16_LARGEST:g} (values changed, not rounded): {_listed(clamped)}"
        )
    if coarse:
        said.append(
            f"weights below float16's normal range ({FLOAT16_NORMAL:.2g}) keep few bits and "
            f"moved by over {COARSE:.0%}: {_listed(coarse)}"
        )
    if not said:
        return ""
    return (
        f"float16 conversion: {'; '.join(said)}; --dtype float16-planned keeps the modules "
        "float16 cannot hold in float32"
    )


def _listed(names: list[str]) -> str:
    return ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _float16(model: onnx.ModelProto, keep: Sequence[str]) -> onnx.ModelProto:
    """`model` in float16 but for the nodes `keep`. The converter casts a kept node's inputs
    and outputs through float16 even between two kept nodes (a value kept in float32 for its
    range would turn infinite there: onnxruntime #21345), and casts a tensor once per kept
    node that reads it, each Cast with the same name and output (a model ONNX Runtime refuses).
    So, as ONNX Runtime's own mixed-precision path (OnnxModel.convert_float_to_float16) and its
    maintainers' advice (onnxruntime #20346) do: the repeated Casts dropped, then each Cast
    pair joined and each Cast to its own type removed. Last, the graph sorted: the converter
    appends its Casts after the nodes that read them, which ONNX Runtime sorts out itself and
    onnx's checker, which every model tconform runs passes, refuses (ViT's plain conversion)."""
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    converted = OnnxModel(
        convert_float_to_float16(model, keep_io_types=True, node_block_list=list(keep))
    )
    if keep:
        _drop_repeated_casts(converted.model.graph)
        converted.remove_cascaded_cast_nodes()
        converted.remove_useless_cast_nodes()
    converted.topological_sort()
    return converted.model


def _drop_repeated_casts(graph: onnx.GraphProto) -> None:
    """Keep one of each set of identical Cast nodes."""
    seen: set[bytes] = set()
    unique = []
    for node in graph.node:
        key = node.SerializeToString()
        if node.op_type != "Cast" or key not in seen:
            unique.append(node)
        seen.add(key)
    del graph.node[:]
    graph.node.extend(unique)

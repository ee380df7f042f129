"""Whether a module's isolated error is more than rounding: the same nodes evaluated plainly by
onnx's reference evaluator (NumPy, one operator at a time, through the execution layer's
onnx-reference runtime), once in the model's own types and once in float64.

A module cut out of the model and fed the reference's inputs can leave a tolerance for three
reasons, and only two of them name it:

- its nodes compute another function than the module: evaluated in float64 on the reference's
  exact inputs, they still leave the tolerance (a scaled weight, a wrong epsilon, a dropped
  bias); the export is wrong there;
- the runtime computes them worse than their precision allows: a plain evaluation in the
  model's own types, on the same rounded inputs, stays within the tolerance, and the runtime's
  error is several times the plain evaluation's (a fused kernel with a less accurate formula, a
  kernel bug), not a rounding that happens to land on the other side of the line;
- neither: the plain evaluation in the model's types leaves the tolerance as well, and float64
  does not. The tolerance is tighter than that precision's rounding at this boundary, and the
  module is not named (`--atol 0 --rtol 0`, or a tolerance far below the values' ulp).

The float64 evaluation runs a copy of the cut whose floating-point tensors, constants and casts
are all float64; masked fills stay as the model wrote them (a float32 -3.4e38 widened), and are
compared clamped to the model type's range, as every boundary is.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto, numpy_helper

from tconform.compare import OutputComparison, Tolerance
from tconform.errors import TconformError, first_line
from tconform.execution import NotRun, Subject, open_subject
from tconform.localise.judge import compare_boundary, share_used
from tconform.localise.scopes import FLOAT_TYPES
from tconform.models import derived_file
from tconform.runtimes import make_runtime

# A float64 evaluation counts as "another function" only beyond this share of the output's
# largest magnitude, added to the tolerance: the float32 constants an exporter writes (1/sqrt(d)
# rounded) move a float64 result by about 1e-7 of its scale, a wrong weight by far more.
FUNCTION_RESOLUTION = 2.0**-20
# How many times a plain evaluation's error the runtime's must be to be the runtime's fault: two
# implementations rounding the same float32 arithmetic differ by a small factor, a kernel that
# computes worse by far more.
RUNTIME_MARGIN = 4.0
# The largest cut (its initializers) evaluated in NumPy: twice that in float64.
MAX_BYTES = 256 * 2**20


class NotEvaluable(Exception):
    """The cut cannot be evaluated plainly (an operator outside ONNX's own domain, a subgraph,
    a size beyond MAX_BYTES): the isolated verdict stands unchecked."""


@dataclass
class CrossCheck:
    """The plain evaluations of one isolated cut, beside the runtime's."""

    runtime: list[OutputComparison]  # the isolated run on the runtime
    plain: list[OutputComparison]  # in the model's own types, on the rounded inputs
    exact: list[OutputComparison] | None  # in float64 on the reference's exact inputs

    @property
    def finding(self) -> str:
        """'function' (its nodes compute something else), 'runtime' (the runtime computes them
        worse than a plain evaluation in the same types) or 'rounding' (neither)."""
        if self.exact is not None and _fails(self.exact):
            return "function"
        plain, runtime = _worst(self.plain), _worst(self.runtime)
        if not _fails(self.plain) and runtime > RUNTIME_MARGIN * plain:
            return "runtime"
        return "rounding"


def _worst(comparisons: list[OutputComparison]) -> float:
    return max((share_used(c) for c in comparisons), default=0.0)


def _fails(comparisons: list[OutputComparison]) -> bool:
    return any(c.status == "fail" for c in comparisons)


def cross_check(
    cut: onnx.ModelProto,
    rounded: dict[str, np.ndarray],
    exact: dict[str, np.ndarray],
    expected: dict[str, np.ndarray],
    runtime: list[OutputComparison],
    tol: Tolerance,
    keep: np.ndarray | None = None,
) -> CrossCheck:
    """The cut evaluated plainly on `rounded` (its inputs in its own types), then in float64 on
    `exact` (the reference's inputs) where that is needed to tell a function from rounding;
    each output against `expected` (the reference's, by output name), at the real positions
    `keep` where given; `runtime`: the runtime's comparisons of the same outputs. NotEvaluable
    where onnx.reference cannot run it."""
    size = sum(t.ByteSize() for t in cut.graph.initializer)
    if size > MAX_BYTES:
        raise NotEvaluable(f"its weights ({size / 2**20:.0f} MB) are too large for NumPy")
    names = list(expected)
    outputs = _evaluate(cut, rounded, names)
    plain = [
        compare_boundary(f"{n} (plain evaluation)", outputs[n], expected[n], tol, keep=keep)
        for n in names
    ]
    found = CrossCheck(runtime, plain, None)
    if found.finding == "runtime":
        return found
    exact_comparisons = []
    widened = _evaluate(as_float64(cut), exact, names)
    for name, held in zip(names, plain, strict=True):
        actual, own = widened[name], outputs[name]
        # The atol the output is held to (scaled to its RMS where the row's is: an unscaled
        # one dwarfs outputs of 1e-7, and a wrong weight there passed as rounding), plus the
        # exporter's float32 constants' resolution.
        allowed = Tolerance(
            held.atol + FUNCTION_RESOLUTION * _scale(expected[name], own.dtype), tol.rtol, tol.why
        )
        label = f"{name} (float64 evaluation)"
        exact_comparisons.append(
            compare_boundary(label, actual, expected[name], allowed, keep=keep, range_of=own.dtype)
        )
    found.exact = exact_comparisons
    return found


def _scale(values: np.ndarray, dtype: np.dtype) -> float:
    """The largest magnitude among `values`, a mask fill at the type's limit aside."""
    magnitudes = np.abs(values[np.isfinite(values)])
    ordinary = magnitudes[magnitudes < float(np.finfo(dtype).max) / 2]
    return float(ordinary.max(initial=0.0))


def _evaluate(
    cut: onnx.ModelProto, feeds: dict[str, np.ndarray], names: list[str]
) -> dict[str, np.ndarray]:
    """The outputs `names` of `cut` on onnx.reference, through the execution layer."""
    with tempfile.TemporaryDirectory(prefix="tconform-crosscheck-") as tmp:
        path = Path(tmp) / "model.onnx"
        onnx.save_model(cut, str(path))
        evaluator = make_runtime("onnx-reference")
        try:
            with open_subject(evaluator, Subject(derived_file(path, cut))) as opened:
                return opened.run(feeds, names)
        except (NotRun, TconformError) as exc:
            raise NotEvaluable(f"onnx.reference cannot run it: {first_line(exc)}") from None
        except Exception as exc:  # an operator the evaluator has but breaks on
            raise NotEvaluable(f"onnx.reference failed on it: {first_line(exc)}") from None


_DTYPE_ATTRIBUTES = {"to", "dtype"}  # Cast's target; RandomNormal's, EyeLike's, ...


def as_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` computing in float64: every floating-point initializer, constant,
    declared type and cast target widened. NotEvaluable for what cannot be widened (another
    domain's operators, subgraphs)."""
    wide = onnx.ModelProto()
    wide.CopyFrom(model)
    graph = wide.graph
    for tensor in graph.initializer:
        _widen_tensor(tensor)
    for value in (*graph.input, *graph.output, *graph.value_info):
        if value.type.tensor_type.elem_type in FLOAT_TYPES:
            value.type.tensor_type.elem_type = TensorProto.DOUBLE
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            raise NotEvaluable(f"operator {node.op_type} of domain {node.domain}")
        if node.op_type == "ConstantOfShape" and not any(a.name == "value" for a in node.attribute):
            # its default is a float32 zero (`x.new_zeros(...)` exports so): widened too
            zero = numpy_helper.from_array(np.zeros(1, np.float64))
            node.attribute.append(onnx.helper.make_attribute("value", zero))
            continue
        for attribute in node.attribute:
            if attribute.type in (AttributeProto.GRAPH, AttributeProto.GRAPHS):
                raise NotEvaluable(f"{node.op_type} holds a subgraph")
            if attribute.type == AttributeProto.TENSOR:
                _widen_tensor(attribute.t)
            elif attribute.name in _DTYPE_ATTRIBUTES and attribute.i in FLOAT_TYPES:
                attribute.i = TensorProto.DOUBLE
            elif node.op_type == "Constant" and attribute.name in ("value_float", "value_floats"):
                value = attribute.f if attribute.name == "value_float" else list(attribute.floats)
                widened = numpy_helper.from_array(np.array(value, np.float64))
                attribute.CopyFrom(onnx.helper.make_attribute("value", widened))
    return wide


def _widen_tensor(tensor: TensorProto) -> None:
    if tensor.data_type in FLOAT_TYPES and tensor.data_type != TensorProto.DOUBLE:
        tensor.CopyFrom(
            numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float64), tensor.name)
        )

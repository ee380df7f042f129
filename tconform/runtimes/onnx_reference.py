"""ONNX's reference evaluator as a runtime: `onnx.reference.ReferenceEvaluator`, a second,
independent implementation of the ONNX operators in plain NumPy. A model that passes on ONNX
Runtime but not here (or the reverse) points at a kernel, not at the export."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx

from tconform.compare import BFLOAT16
from tconform.errors import KernelMissing, UsageError
from tconform.runtimes.base import Runtime, Session, TensorInfo


@dataclass
class OnnxReferenceRuntime(Runtime):
    name: ClassVar[str] = "onnx-reference"
    consumes: ClassVar[str] = "onnx"
    eps: ClassVar[tuple[str, ...]] = ("cpu",)
    package: ClassVar[str] = "onnx"  # on the package index (`--runtime onnx-reference==X`)
    timed: ClassVar[bool] = False  # a NumPy evaluator of each operator: not a deployment target

    ep: str = "cpu"

    @property
    def precision(self) -> str:
        return "float32"

    def settings(self) -> dict[str, object]:
        return {"evaluator": "onnx.reference.ReferenceEvaluator", "onnx": onnx.__version__}

    def open(self, model_path: Path) -> OnnxReferenceSession:
        from onnx.reference import ReferenceEvaluator

        try:
            model = onnx.load(str(model_path))
            evaluator = ReferenceEvaluator(model)
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            missing = re.search(
                r"No implementation for operator '(\w+)' domain '[\w.]*' and "
                r"version (\d+)",
                first,
            )
            if missing:  # e.g. DequantizeLinear below opset 19 (an int8 graph at opset 18)
                op, version = missing.groups()
                raise KernelMissing("onnx.reference", f"{op} (opset {version})", "any") from None
            unknown = re.search(r"Node type '(\w+)' from domain '([\w.]+)' is unknown", first)
            if unknown:  # a contrib op: MatMulNBits of an int4 graph (com.microsoft)
                op, domain = unknown.groups()
                raise KernelMissing("onnx.reference", f"{op} ({domain})", "any") from None
            raise UsageError(f"{model_path}: onnx.reference cannot load it: {first}") from None
        return OnnxReferenceSession(evaluator, model)


_NUMPY_TYPES = {
    onnx.TensorProto.FLOAT: np.float32,
    onnx.TensorProto.FLOAT16: np.float16,
    onnx.TensorProto.BFLOAT16: BFLOAT16,
    onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32,
    onnx.TensorProto.BOOL: np.bool_,
}


def declared_inputs(model: onnx.ModelProto) -> list[TensorInfo]:
    """The graph inputs that are not initializers, as the file declares them."""
    initializers = {t.name for t in model.graph.initializer}
    found = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        numpy_type = _NUMPY_TYPES.get(tensor.elem_type)
        found.append(
            TensorInfo(
                value.name,
                np.dtype(numpy_type) if numpy_type is not None else None,
                len(tensor.shape.dim) if tensor.HasField("shape") else None,
            )
        )
    return found


class OnnxReferenceSession(Session):
    def __init__(self, evaluator: object, model: onnx.ModelProto) -> None:
        self.evaluator = evaluator
        self.providers = ["onnx.reference"]
        self.placement: dict[str, int] = {}
        self.fallback_ops: dict[str, int] = {}
        self.precision = "float32"
        self.inputs = declared_inputs(model)
        self.outputs = [o.name for o in model.graph.output]
        self.notes: list[str] = []

    def run(
        self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
    ) -> dict[str, np.ndarray]:
        wanted = list(outputs) if outputs else self.outputs
        values = self.evaluator.run(wanted, dict(feeds))
        return {name: np.asarray(value) for name, value in zip(wanted, values, strict=True)}

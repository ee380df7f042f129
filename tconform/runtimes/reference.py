"""ONNX's reference evaluator as a runtime: `onnx.reference.ReferenceEvaluator`, a second,
independent implementation of the ONNX operators in plain NumPy. A model that passes on ONNX
Runtime but not here (or the reverse) points at a kernel, not at the export."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import numpy as np
import onnx

from tconform.errors import UsageError


@dataclass
class ReferenceRuntime:
    name: ClassVar[str] = "onnx-reference"
    consumes: ClassVar[str] = "onnx"
    eps: ClassVar[tuple[str, ...]] = ("cpu",)

    ep: str = "cpu"

    @property
    def precision(self) -> str:
        return "float32"

    def settings(self) -> dict[str, object]:
        return {"evaluator": "onnx.reference.ReferenceEvaluator", "onnx": onnx.__version__}

    def open(self, model_path: Path) -> ReferenceSession:
        from onnx.reference import ReferenceEvaluator

        try:
            evaluator = ReferenceEvaluator(str(model_path))
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise UsageError(f"{model_path}: onnx.reference cannot load it: {first}") from None
        return ReferenceSession(evaluator)


@dataclass
class ReferenceSession:
    evaluator: object
    providers: list[str] = field(default_factory=lambda: ["onnx.reference"])
    placement: dict[str, int] = field(default_factory=dict)
    fallback_ops: dict[str, int] = field(default_factory=dict)

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [np.asarray(out) for out in self.evaluator.run(None, feeds)]

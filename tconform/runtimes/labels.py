"""The one place that names a runtime in reports: 'ort-cpu', 'ort-cuda (tf32)', 'torch',
'torch-cuda', 'oracle (float64)', 'onnx-reference'. Cheap to import (no runtime libraries)."""

from __future__ import annotations

# Short prefixes for runtimes whose name is long; every other runtime is named as it is.
_SHORT = {"onnxruntime": "ort"}


def runtime_label(runtime: str, ep: str = "cpu", precision: str = "float32") -> str:
    """A runtime on a device at a precision. The CPU is implied for every runtime but ONNX
    Runtime (whose provider is the point), float32 for all."""
    name = _SHORT.get(runtime, runtime)
    base = f"{name}-{ep}" if runtime in _SHORT or ep != "cpu" else name
    return base if precision == "float32" else f"{base} ({precision})"

"""The one place that names a runtime in reports: 'ort-cpu', 'ort-cuda (tf32)', 'torch',
'torch-cuda', 'oracle (float64)', 'onnx-reference', 'ort-cpu==1.20.1' (a runtime spec's
release or interpreter follows the name). Cheap to import (no runtime libraries)."""

from __future__ import annotations

from tconform.runtimes.specs import base_name, spec_suffix

# Short prefixes for runtimes whose name is long; every other runtime is named as it is.
_SHORT = {"onnxruntime": "ort"}


def runtime_label(runtime: str, ep: str = "cpu", precision: str = "float32") -> str:
    """A runtime (a name or a spec's text) on a device at a precision. The CPU is implied for
    every runtime but ONNX Runtime (whose provider is the point), float32 for all."""
    name = base_name(runtime)
    short = _SHORT.get(name, name)
    base = (f"{short}-{ep}" if name in _SHORT or ep != "cpu" else short) + spec_suffix(runtime)
    return base if precision == "float32" else f"{base} ({precision})"

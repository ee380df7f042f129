"""tconform: export a reference Transformer (or your own PyTorch module) to ONNX, verify it on
runtimes (ONNX Runtime on each execution provider, OpenVINO, ONNX's reference evaluator,
PyTorch) against exact float64 goldens, and measure it.

Importing the package is cheap: torch, onnx and onnxruntime load only when a stage needs them.
`tconform.check(module, example_inputs, ...)` checks your own module, `tconform.verify(...)`
tconform's own cases (tconform.api; see the README).
"""

from __future__ import annotations

import os
from importlib import metadata

# ONNX Runtime's telemetry writes a device id under ~/.cache (or $XDG_CACHE_HOME) as it is
# imported: a file outside anything tconform writes, and inside a golden folder where HOME
# names one. Off unless the user set the variable; the runtimes' workers inherit it.
os.environ.setdefault("ORT_DISABLE_TELEMETRY", "1")

try:
    __version__ = metadata.version("tconform")
except metadata.PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str):
    if name in ("check", "verify"):  # the Python API (tconform.api), loaded on first use
        from tconform import api

        return getattr(api, name)
    raise AttributeError(f"module 'tconform' has no attribute {name!r}")

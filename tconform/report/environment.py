"""The environment block shared by every report."""

from __future__ import annotations

import onnxruntime

from tconform.versions import cpu_name, library_versions


def environment() -> dict[str, object]:
    versions = library_versions()
    return {
        "python": versions["python"],
        "torch": versions["torch"],
        "onnx": versions["onnx"],
        "onnxscript": versions["onnxscript"],
        "onnxruntime": versions["onnxruntime"],
        "numpy": versions["numpy"],
        "providers_available": onnxruntime.get_available_providers(),
        "cpu": cpu_name(),
    }

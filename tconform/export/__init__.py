"""torch -> ONNX: one model per case, cached by what determines its bytes, with a manifest.

  settings.py   ExportSettings (exporter, opset, dtype, attention kernel) and the cache key
  exporter.py   the torch.onnx call: module and weights, example inputs, dynamic axes, checker
  artifacts.py  the artifacts folder: records, manifest, the cache's rules, staged placement
  pool.py       export_jobs / export_cases: many jobs at once, in worker processes
  quantize.py   the int8 and int4 dtypes: a float32 export through onnxruntime.quantization

Callers import from here; the names below are the package's interface.
"""

from __future__ import annotations

from tconform.export.artifacts import (
    ExportRecord,
    export_case,
    folder_settings,
    read_artifacts_manifest,
    require_new_or_artifacts,
)
from tconform.export.exporter import (
    build_module,
    checked_model,
    dynamic_axes,
    example_shape,
    export_with_torch,
    exporter_error_line,
)
from tconform.export.pool import ExportJob, export_cases, export_jobs
from tconform.export.quantize import QUANTIZERS, quantize_int4, quantize_int8
from tconform.export.settings import (
    DEFAULT_OPSET,
    DTYPES,
    EXPORTERS,
    INT4_QUANTIZATION,
    INT8_QUANTIZATION,
    IO_DTYPES,
    OPSETS,
    ExportSettings,
    cache_key,
    default_opset,
)

__all__ = [
    "DEFAULT_OPSET",
    "DTYPES",
    "EXPORTERS",
    "INT4_QUANTIZATION",
    "INT8_QUANTIZATION",
    "IO_DTYPES",
    "OPSETS",
    "QUANTIZERS",
    "ExportJob",
    "ExportRecord",
    "ExportSettings",
    "build_module",
    "cache_key",
    "checked_model",
    "default_opset",
    "dynamic_axes",
    "example_shape",
    "export_case",
    "export_cases",
    "export_jobs",
    "export_with_torch",
    "exporter_error_line",
    "folder_settings",
    "quantize_int4",
    "quantize_int8",
    "read_artifacts_manifest",
    "require_new_or_artifacts",
]

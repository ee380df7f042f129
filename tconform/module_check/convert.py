"""A user's model in a reduced precision, made with the field's own tools from its float32
export, as a user of ONNX Runtime would make it:
  float16   onnxruntime.transformers.float16.convert_float_to_float16, keep_io_types=True (the
            inputs and outputs stay float32; Casts at the edges);
  int8      onnxruntime.quantization.quantize_dynamic (tconform.export.quantize: int8 weights,
            activations quantised per call);
  bfloat16  not a conversion: the module itself exported in bfloat16 (tconform.suites.module).
Nodes a converter adds carry no module scope; each takes the scope its consumers share
(tconform.export.quantize.restore_scopes), so localisation places them in their module.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from tconform.export.quantize import quantize_int8, quiet_quantizer, restore_scopes
from tconform.files import atomic_write_bytes

DTYPES = ("float32", "float16", "bfloat16", "int8")  # a user's model's dtype axis
CONVERTED = ("float16", "int8")  # made from the float32 export; the others exported


def convert(base: Path, dtype: str, target: Path) -> None:
    """The float32 model `base` converted to `dtype` (one of CONVERTED), written to `target`."""
    if dtype == "int8":
        quantize_int8(base, target)
        return
    from onnxruntime.transformers.float16 import convert_float_to_float16
    from onnxruntime.transformers.onnx_model import OnnxModel

    with quiet_quantizer():  # the converter logs on the root logger too
        model = convert_float_to_float16(onnx.load(str(base)), keep_io_types=True)
        # The converter appends the Casts of float inputs after their consumers; ONNX wants
        # every node after what it reads (ONNX Runtime's own wrapper sorts the same way).
        OnnxModel.graph_topological_sort(model.graph, is_deterministic=True)
    restore_scopes(model.graph)
    atomic_write_bytes(target, model.SerializeToString())

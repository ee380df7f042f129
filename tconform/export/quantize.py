"""The int8 dtype: a float32 export quantised by ONNX Runtime's own tool.

`onnxruntime.quantization.quantize_dynamic` is what a user of ONNX Runtime runs to get an int8
model: every MatMul with a weight becomes DynamicQuantizeLinear (the activation to uint8, its
scale and zero point computed per call) + MatMulInteger with the int8 weight + the rescale to
float32, and every Gather from a weight table reads an int8 table through DequantizeLinear. Ops
without weights (attention's activation products, softmax, norms) stay float32, as do the
inputs and outputs. The settings are `settings.INT8_QUANTIZATION` (why reduce_range: there).
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

from tconform.export.settings import INT8_QUANTIZATION


@contextlib.contextmanager
def _quiet_quantizer():
    """The quantiser logs advice (run pre-processing first) on the root logger and prints;
    tconform reports instead."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        root.setLevel(level)


def quantize_int8(source: Path, target: Path) -> None:
    """`source` (a float32 ONNX file) quantised to int8 weights into `target`."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    settings = dict(INT8_QUANTIZATION)
    weight_type = getattr(QuantType, str(settings.pop("weight_type")))
    with _quiet_quantizer():
        quantize_dynamic(source, target, weight_type=weight_type, **settings)

"""ONNX Runtime's profile events summed per op type (OrtSession.op_profile reads them)."""

from __future__ import annotations

import pytest

from tconform.runtimes.onnxruntime import kernel_time_by_op_type

pytestmark = pytest.mark.unit


def kernel(name: str, op: str, ts: int, dur: int) -> dict:
    return {"cat": "Node", "name": name, "ts": ts, "dur": dur, "args": {"op_name": op}}


def test_profile_sums_kernel_time_per_op_type_after_the_warmup():
    events = [
        {"cat": "Session", "name": "model_run", "ts": 0, "dur": 900},
        kernel("a_kernel_time", "MatMul", 10, 500),  # warm-up run: left out
        {"cat": "Session", "name": "model_run", "ts": 1000, "dur": 100},
        kernel("a_kernel_time", "MatMul", 1010, 30),
        kernel("b_kernel_time", "MatMul", 1050, 12),
        kernel("c_kernel_time", "Softmax", 1070, 5),
        kernel("c_fence_before", "Softmax", 1069, 99),  # not a kernel time
    ]
    assert kernel_time_by_op_type(events, skip_runs=1) == {"MatMul": 42.0, "Softmax": 5.0}
    assert kernel_time_by_op_type(events)["MatMul"] == 542.0

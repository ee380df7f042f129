"""A runtime's own per-op profile of one model (ONNX Runtime's enable_profiling, through the
execution layer), and the share of kernel time spent outside matrix products."""

from __future__ import annotations

import numpy as np

from tconform.errors import UsageError
from tconform.execution import Subject, open_subject
from tconform.models import ModelUnderTest
from tconform.runtimes import Runtime, label

# Op types whose time is matrix products. ONNX's fused Attention is counted with them: its time
# is mostly its two batched products (Q K^T and weights V), the softmax between them is in it.
# So are the int8 graph's products: MatMulInteger, and the kernels ONNX Runtime fuses it into
# with the activation's quantisation (DynamicQuantizeMatMul) or the rescale to float
# (MatMulIntegerToFloat); the quantisation inside them is a small part of their time.
MATRIX_OPS = frozenset(
    {
        "MatMul",
        "Gemm",
        "FusedMatMul",
        "Attention",
        "MultiHeadAttention",
        "MatMulInteger",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
    }
)


def op_profile(
    runtime: Runtime, model: ModelUnderTest, feeds: dict[str, np.ndarray]
) -> dict[str, dict[str, float]]:
    """{op type: {"ms_per_run", "share"}}, biggest first."""
    with open_subject(runtime, Subject(model)) as opened:
        per_run = opened.op_profile(feeds)
    if per_run is None:
        raise UsageError(f"{label(runtime)} keeps no per-op profile")
    grand = sum(per_run.values()) or 1.0
    return {
        op: {"ms_per_run": round(ms, 3), "share": round(ms / grand, 3)}
        for op, ms in sorted(per_run.items(), key=lambda kv: -kv[1])
    }


def outside_matmul_share(profile: dict[str, dict[str, float]]) -> float:
    """The share of kernel time in ops that are not matrix products (MATRIX_OPS)."""
    return round(sum(v["share"] for op, v in profile.items() if op not in MATRIX_OPS), 3)

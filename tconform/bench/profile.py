"""ONNX Runtime's own per-op profile of one model (enable_profiling), summed per op type, and
the share of kernel time spent outside matrix products."""

from __future__ import annotations

import json
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tconform.runtimes.onnxruntime import OrtRuntime

# Op types whose time is matrix products. ONNX's fused Attention is counted with them: its time
# is mostly its two batched products (Q K^T and weights V), the softmax between them is in it.
MATRIX_OPS = frozenset({"MatMul", "Gemm", "FusedMatMul", "Attention", "MultiHeadAttention"})


@dataclass
class ProfilingOrtRuntime(OrtRuntime):
    """OrtRuntime whose sessions write ONNX Runtime's profile (enable_profiling)."""

    profile_prefix: str = "ort_profile"

    def session_options(self):
        options = super().session_options()
        options.enable_profiling = True
        options.profile_file_prefix = self.profile_prefix
        return options


def profile_by_op_type(events: list[dict], skip_runs: int = 0) -> dict[str, float]:
    """Total kernel microseconds per op type from ONNX Runtime's profile events, leaving out
    the kernels of the first `skip_runs` runs (the warm-up, which allocates and is slower)."""
    starts = sorted(e["ts"] for e in events if e.get("name") == "model_run")
    since = starts[skip_runs] if 0 < skip_runs < len(starts) else float("-inf")
    totals: Counter[str] = Counter()
    for event in events:
        if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
            continue
        if event.get("ts", 0) >= since:
            totals[event.get("args", {}).get("op_name", "?")] += float(event.get("dur", 0))
    return dict(totals)


def ort_op_profile(
    runtime: OrtRuntime, model: Path, feeds: dict[str, np.ndarray], runs: int = 3
) -> dict[str, dict[str, float]]:
    """{op type: {"ms_per_run", "share"}} over `runs` profiled runs, biggest first."""
    with tempfile.TemporaryDirectory() as tmp:
        profiling = ProfilingOrtRuntime(
            runtime.ep,
            runtime.graph_opt,
            runtime.intra_op_threads,
            session_config=dict(runtime.session_config),
            disabled_optimizers=runtime.disabled_optimizers,
            profile_prefix=str(Path(tmp) / "profile"),
        )
        session = profiling.open(model).session
        for _ in range(1 + runs):  # one warm-up, left out of the totals
            session.run(None, feeds)
        events = json.loads(Path(session.end_profiling()).read_text())
    totals = profile_by_op_type(events, skip_runs=1)
    grand = sum(totals.values()) or 1.0
    return {
        op: {"ms_per_run": round(us / runs / 1e3, 3), "share": round(us / grand, 3)}
        for op, us in sorted(totals.items(), key=lambda kv: -kv[1])
    }


def outside_matmul_share(profile: dict[str, dict[str, float]]) -> float:
    """The share of kernel time in ops that are not matrix products (MATRIX_OPS)."""
    return round(sum(v["share"] for op, v in profile.items() if op not in MATRIX_OPS), 3)

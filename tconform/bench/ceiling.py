"""The machine's limits, measured in the same run: float32 GEMM FLOP/s through ONNX Runtime on
the benchmarked provider and threads (the ceiling engines are compared with), numpy's GEMM for
comparison, and memory copy bandwidth (for the memory-bound floor of batch-1 cases)."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tconform.bench.timing import round_sig, timed_runs
from tconform.execution import Subject, open_subject
from tconform.models import derived_file
from tconform.runtimes.onnxruntime import OrtRuntime
from tconform.versions import cpu_name

GEMM_SIZE = 2048  # large enough to be compute-bound, small enough to time in ~0.1 s on 2 cores
COPY_BYTES = 256 * 2**20  # far beyond any last-level cache


def matmul_model(size: int) -> bytes:
    """An ONNX graph Y = A @ B with a (size x size) float32 weight B held as an initializer."""
    rng = np.random.default_rng(0)
    weight = onnx.numpy_helper.from_array(
        rng.standard_normal((size, size), dtype=np.float32), name="B"
    )
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["Y"])],
        "gemm_ceiling",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [size, size])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [size, size])],
        [weight],
    )
    # IR 10 / opset 18: ONNX Runtime 1.31 refuses the IR 14 that onnx 1.23 stamps by default.
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return model.SerializeToString()


def ort_gemm_gflops(runtime: OrtRuntime, size: int | None = None, runs: int = 15) -> float:
    """Best-of-`runs` GFLOP/s of a float32 (size^3) MatMul in ONNX Runtime on `runtime`'s
    provider and threads (on a provider with device memory with input and output bound there,
    so no host copies are timed). The best run estimates the ceiling; medians include noise."""
    size = size or GEMM_SIZE  # read at call time, so tests can shrink it
    a = np.random.default_rng(1).standard_normal((size, size), dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "matmul.onnx"
        path.write_bytes(matmul_model(size))
        subject = Subject(derived_file(path))
        with open_subject(runtime, subject) as opened:
            call = opened.timed_call({"A": a}, io_binding=runtime.device_memory)
            times = timed_runs(call.run, warmup=2, runs=runs)
            call.close()
    return 2 * size**3 / min(times) / 1e9


def numpy_gemm_gflops(size: int | None = None, runs: int = 5) -> float:
    """numpy's float32 GEMM (its own BLAS and thread pool), recorded for reference only."""
    size = size or GEMM_SIZE
    rng = np.random.default_rng(2)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    times = timed_runs(lambda: a @ b, warmup=1, runs=runs)
    return 2 * size**3 / min(times) / 1e9


def copy_bandwidth_gbs(nbytes: int | None = None, runs: int = 5) -> float:
    """Memory bandwidth of a large array copy, counting bytes read plus bytes written."""
    nbytes = nbytes or COPY_BYTES
    source = np.ones(nbytes // 4, dtype=np.float32)
    target = np.empty_like(source)
    times = timed_runs(lambda: np.copyto(target, source), warmup=1, runs=runs)
    return 2 * nbytes / min(times) / 1e9


def measure_ceiling(runtime: OrtRuntime) -> dict[str, object]:
    """The ceiling block of the report for one provider."""
    started = time.perf_counter()
    ceiling: dict[str, object] = {
        "device": f"{runtime.ep} ({cpu_name()})" if runtime.ep == "cpu" else runtime.ep,
        "gemm_gflops": round(ort_gemm_gflops(runtime), 2),
        "gemm_source": f"ONNX Runtime MatMul {GEMM_SIZE}^3 float32, {runtime.provider}, "
        f"intra_op_threads={runtime.threads}, best of 15 runs",
    }
    if runtime.ep == "cpu":
        ceiling["numpy_gemm_gflops"] = round(numpy_gemm_gflops(), 2)
        ceiling["copy_bandwidth_gbs"] = round(copy_bandwidth_gbs(), 2)
        ceiling["copy_source"] = (
            f"numpy copyto of {COPY_BYTES // 2**20} MiB, (read + write bytes) / best of 5"
        )
    ceiling["seconds"] = round(time.perf_counter() - started, 2)
    return ceiling


def remeasure_ceiling(runtime: OrtRuntime, ceiling: dict, rows: list[dict]) -> None:
    """Measure `runtime`'s GEMM ceiling again after the timings and keep the higher: on a
    shared machine one measurement can land on someone else's burst of work, and a ceiling that
    is too low would flatter every fraction. The rows' fractions and memory floors on that
    provider are recomputed against the result."""
    again = measure_ceiling(runtime)
    ceiling["gemm_gflops_runs"] = [ceiling["gemm_gflops"], again["gemm_gflops"]]
    ceiling["gemm_gflops"] = max(ceiling["gemm_gflops_runs"])
    for key in ("numpy_gemm_gflops", "copy_bandwidth_gbs"):
        if key in again:
            ceiling[key] = max(ceiling[key], again[key])
    for row in rows:
        if row["ep"] != runtime.ep:
            continue
        if row.get("peak_fraction") is not None:
            row["peak_fraction"] = round(row["gflops"] / ceiling["gemm_gflops"], 3)
        if "weight_bytes" in row:
            row["memory_floor_ms"] = memory_floor_ms(row["weight_bytes"], ceiling)


def memory_floor_ms(weight_bytes: int, ceiling: dict) -> float:
    """The time to stream `weight_bytes` once at the measured copy bandwidth: no forward pass
    that reads every weight can be faster (the bound that matters at batch 1)."""
    return round_sig(weight_bytes / (ceiling["copy_bandwidth_gbs"] * 1e6))

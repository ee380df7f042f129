"""The machine's limits, measured in the same run: the GEMM FLOP/s of each precision an engine
computes in (float32, bfloat16, float16, int8, int4), from a tiny probe per runtime that has the
kernels, numpy's float32 GEMM for comparison, and memory copy bandwidth (for the memory-bound
floor of batch-1 cases).

A precision's ceiling is the fastest of its probes: each runs one (size x size x size) product
on the bench's provider and threads, through the kernels an engine of that precision runs:

  float32   ONNX Runtime MatMul; torch.mm
  bfloat16  OpenVINO's MatMul at its bf16 inference precision (where OpenVINO reads it back:
            AVX512-BF16 or AMX); torch.mm of bfloat16 tensors (what autocast runs)
  float16   ONNX Runtime MatMul converted as a user's float16 model is; torch.mm of float16
            tensors
  int8      ONNX Runtime on the MatMul quantised by the int8 dtype's own settings
            (DynamicQuantizeMatMul after fusion); torch's dynamic int8 Linear
  int4      ONNX Runtime on the MatMul quantised by the int4 dtype's own settings (MatMulNBits)

Each row's share of the ceiling is against its own precision's (`share_of_ceiling`). A probe
that cannot run here (a runtime not installed, a precision the CPU lacks) says why.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from tconform.bench.engines import BASELINE, RuntimeFor
from tconform.bench.timing import round_sig
from tconform.errors import ProviderUnavailable
from tconform.execution import Subject, open_subject
from tconform.export import QUANTIZERS
from tconform.models import derived_file
from tconform.module_check.convert import convert
from tconform.runtimes import Runtime
from tconform.runtimes.providers import DEVICE_TYPES
from tconform.versions import cpu_name

GEMM_SIZE = 2048  # large enough to be compute-bound, small enough to time in ~0.1 s on 2 cores
# On a GPU a 2048^3 float16 product takes ~0.06 ms, too short to fill the device or to time
# well: on two H200s its rate was 311 and 258 TFLOP/s while the model's own stayed at 166-169
# (docs/cuda.md, runs 4 and 6). 4096^3 is eight times the work.
GEMM_SIZE_ON_DEVICE = 4096
COPY_BYTES = 256 * 2**20  # far beyond any last-level cache
DEVICE_COPY_BYTES = 2**30  # a GPU copies 256 MiB in ~0.1 ms, near the launch and sync overhead
PROBE_RUNS = 15  # the best of up to this many runs estimates a ceiling; medians include noise
PROBE_SECONDS = 3.0  # ... or of the runs that fit in this budget (at least 3): a slow probe
MIN_PROBE_RUNS = 3


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


def best_rate(run: Callable[[], object], work: float, warmup: int = 2) -> float:
    """`work` (FLOP, bytes) per nanosecond (GFLOP/s, GB/s) of the fastest of up to PROBE_RUNS
    calls of `run` (at least MIN_PROBE_RUNS, and no more than fit in PROBE_SECONDS after those),
    after `warmup` untimed ones."""
    for _ in range(warmup):
        run()
    times: list[float] = []
    started = time.perf_counter()
    while len(times) < PROBE_RUNS:
        if len(times) >= MIN_PROBE_RUNS and time.perf_counter() - started >= PROBE_SECONDS:
            break
        t0 = time.perf_counter()
        run()
        times.append(time.perf_counter() - t0)
    return work / min(times) / 1e9


def onnx_gemm_gflops(runtime: Runtime, size: int | None = None, dtype: str = "float32") -> float:
    """GFLOP/s of the (size^3) MatMul model, quantised to `dtype` by that dtype's quantiser
    where it is one (int8, int4) or converted to float16 (keep_io_types), on `runtime`'s
    provider and threads (on a provider with device memory with input and output bound there,
    so no host copies are timed)."""
    size = size or GEMM_SIZE  # read at call time, so tests can shrink it
    a = np.random.default_rng(1).standard_normal((size, size), dtype=np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "matmul.onnx"
        path.write_bytes(matmul_model(size))
        if dtype in QUANTIZERS:
            QUANTIZERS[dtype](path, path.with_name(f"{dtype}.onnx"))
            path = path.with_name(f"{dtype}.onnx")
        elif dtype == "float16":  # as a user's model's float16 cell is made
            convert(path, dtype, path.with_name(f"{dtype}.onnx"))
            path = path.with_name(f"{dtype}.onnx")
        with open_subject(runtime, Subject(derived_file(path))) as opened:
            call = opened.timed_call({"A": a}, io_binding=runtime.device_memory)
            try:
                return best_rate(call.run, 2 * size**3)
            finally:
                call.close()


def torch_gemm_gflops(dtype: str) -> tuple[float, int]:
    """(GFLOP/s, size) of a (size^3) product through torch on the CPU, with torch's threads as
    the bench set them: torch.mm in float32, bfloat16 or float16; for int8 torch's dynamic int8
    Linear (what torch.ao.quantization.quantize_dynamic gives torch-int8), fed float32
    activations.
    Without native kernels a precision can be very slow (bfloat16 on an AVX2-only CPU: well
    under 1 GFLOP/s), so the size is the largest of GEMM_SIZE, GEMM_SIZE/2, ... whose product
    one timed run at 256^3 predicts to fit the probe's time budget (a smaller product is no
    slower per FLOP there, so its ceiling is not flattering)."""
    size = _fitting_size(lambda n: _torch_product(dtype, n))
    run = _torch_product(dtype, size)
    with torch.inference_mode():
        return best_rate(run, 2 * size**3), size


SMALLEST_PROBE = 256


def _fitting_size(product: Callable[[int], Callable[[], object]]) -> int:
    """The largest power-of-two fraction of GEMM_SIZE (down to SMALLEST_PROBE) whose product is
    predicted, from one run at SMALLEST_PROBE^3, to run MIN_PROBE_RUNS times in PROBE_SECONDS."""
    small = min(SMALLEST_PROBE, GEMM_SIZE)
    run = product(small)
    with torch.inference_mode():
        run()  # first-call setup
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
    size = GEMM_SIZE
    while size > small and seconds * (size / small) ** 3 * MIN_PROBE_RUNS > PROBE_SECONDS:
        size //= 2
    return size


def _torch_product(dtype: str, size: int) -> Callable[[], object]:
    """One (size^3) product in torch at `dtype`, ready to call."""
    generator = torch.Generator().manual_seed(3)
    a = torch.randn(size, size, generator=generator)
    if dtype == "int8":
        import warnings

        with warnings.catch_warnings():  # torch.ao.quantization's deprecation notices
            warnings.simplefilter("ignore")
            linear = torch.ao.nn.quantized.dynamic.Linear(size, size, bias_=False)
        weight = torch.randn(size, size, generator=generator)
        scale = float(weight.abs().max()) / 127
        linear.set_weight_bias(torch.quantize_per_tensor(weight, scale, 0, torch.qint8), None)
        return lambda: linear(a)
    b = torch.randn(size, size, generator=generator)
    typed = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    a, b = a.to(typed), b.to(typed)
    return lambda: torch.mm(a, b)


@dataclass(frozen=True)
class Probe:
    """One runtime's kernels for one precision: how to time them on a provider, giving
    (GFLOP/s, the size of the square product timed)."""

    precision: str
    runtime: str
    source: str
    eps: tuple[str, ...]
    measure: Callable[[RuntimeFor, str], tuple[float, int]]


def _openvino_bf16(runtime_for: RuntimeFor, ep: str) -> float:
    runtime = runtime_for("openvino", ep, bf16=True)
    if runtime.precision != "bfloat16":  # read back from OpenVINO before anything is timed
        raise ProviderUnavailable(
            f"openvino computes {runtime.precision}, not bfloat16, on this CPU "
            "(no AVX512-BF16 or AMX)"
        )
    return onnx_gemm_gflops(runtime), GEMM_SIZE


def _onnx_probe(dtype: str) -> Callable[[RuntimeFor, str], tuple[float, int]]:
    """ONNX Runtime on the MatMul model of `dtype` (float32, or quantised to int8 or int4)."""

    def probe(runtime_for: RuntimeFor, ep: str) -> tuple[float, int]:
        size = GEMM_SIZE_ON_DEVICE if ep in DEVICE_TYPES else GEMM_SIZE
        return onnx_gemm_gflops(runtime_for("onnxruntime", ep), size, dtype), size

    return probe


PROBES = (
    Probe("float32", "onnxruntime", "ONNX Runtime MatMul float32", ("cpu", "cuda"),
          _onnx_probe("float32")),
    Probe("float32", "torch", "torch.mm float32", ("cpu",),
          lambda runtime_for, ep: torch_gemm_gflops("float32")),
    Probe("bfloat16", "openvino", "OpenVINO MatMul at inference precision bf16", ("cpu",),
          _openvino_bf16),
    Probe("bfloat16", "torch", "torch.mm bfloat16 (what autocast runs)", ("cpu",),
          lambda runtime_for, ep: torch_gemm_gflops("bfloat16")),
    Probe("float16", "onnxruntime",
          "ONNX Runtime MatMul converted to float16 (onnxruntime.transformers.float16)",
          ("cpu", "cuda"), _onnx_probe("float16")),
    Probe("float16", "torch", "torch.mm float16", ("cpu",),
          lambda runtime_for, ep: torch_gemm_gflops("float16")),
    Probe("int8", "onnxruntime",
          "ONNX Runtime MatMul quantised as --dtype int8 (DynamicQuantizeMatMul)", ("cpu",),
          _onnx_probe("int8")),
    Probe("int8", "torch", "torch dynamic int8 Linear (quantize_dynamic's)", ("cpu",),
          lambda runtime_for, ep: torch_gemm_gflops("int8")),
    Probe("int4", "onnxruntime", "ONNX Runtime MatMul quantised as --dtype int4 (MatMulNBits)",
          ("cpu",), _onnx_probe("int4")),
)  # fmt: skip


def numpy_gemm_gflops(size: int | None = None) -> float:
    """numpy's float32 GEMM (its own BLAS and thread pool), recorded for reference only."""
    size = size or GEMM_SIZE
    rng = np.random.default_rng(2)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    return best_rate(lambda: a @ b, 2 * size**3, warmup=1)


def copy_bandwidth_gbs(nbytes: int | None = None) -> float:
    """Memory bandwidth of a large array copy, counting bytes read plus bytes written."""
    nbytes = nbytes or COPY_BYTES
    source = np.ones(nbytes // 4, dtype=np.float32)
    target = np.empty_like(source)
    return best_rate(lambda: np.copyto(target, source), 2 * nbytes, warmup=1)


def device_copy_bandwidth_gbs(ep: str, device_id: int = 0) -> float | None:
    """The copy bandwidth of provider `ep`'s own memory (a GPU's), through torch, counting bytes
    read plus bytes written; None where this torch sees no such device or cannot fill it (the
    rows then go without a floor; the run goes on)."""
    device_type = DEVICE_TYPES.get(ep)
    backend = getattr(torch, device_type, None) if device_type else None
    if backend is None or not backend.is_available():
        return None
    try:
        return _copy_rate(backend, torch.device(device_type, device_id))
    except RuntimeError:  # no such device, out of its memory
        return None
    finally:
        backend.empty_cache()  # the copies' GiBs back to the device, not kept for torch


def _copy_rate(backend, device: torch.device) -> float:
    source = torch.ones(DEVICE_COPY_BYTES // 4, device=device)
    target = torch.empty_like(source)

    def copy() -> None:
        target.copy_(source)
        backend.synchronize(device)

    return best_rate(copy, 2 * DEVICE_COPY_BYTES, warmup=1)


def measure_ceiling(
    runtime_for: RuntimeFor, ep: str, precisions: tuple[str, ...] = ("float32",)
) -> dict[str, object]:
    """The ceiling block of the report for one provider: every probe of each of `precisions`
    (float32 always) that runs on `ep`, and on the CPU numpy's GEMM and the copy bandwidth."""
    started = time.perf_counter()
    wanted = {"float32", *precisions}
    by_precision: dict[str, dict] = {}
    for probe in PROBES:
        if probe.precision not in wanted or ep not in probe.eps:
            continue
        entry = by_precision.setdefault(probe.precision, {"probes": {}, "unavailable": {}})
        try:
            gflops, size = probe.measure(runtime_for, ep)
        except ProviderUnavailable as exc:
            entry["unavailable"][probe.runtime] = str(exc)
            continue
        entry["probes"][probe.runtime] = {
            "gflops": round(gflops, 2),
            "size": size,
            "source": f"{probe.source}, {size}^3, best of up to {PROBE_RUNS} runs",
        }
    for precision in wanted - set(by_precision):
        by_precision[precision] = {"probes": {}, "unavailable": {"any": f"no probe on {ep}"}}
    threads = getattr(runtime_for(BASELINE, ep), "threads", None)
    ceiling: dict[str, object] = {
        "device": f"{ep} ({cpu_name()})" if ep == "cpu" else ep,
        "threads": threads,
        "precisions": by_precision,
    }
    _settle(ceiling)
    if ep == "cpu":
        ceiling["numpy_gemm_gflops"] = round(numpy_gemm_gflops(), 2)
        ceiling["copy_bandwidth_gbs"] = round(copy_bandwidth_gbs(), 2)
        ceiling["copy_source"] = (
            f"numpy copyto of {COPY_BYTES // 2**20} MiB, (read + write bytes) / best of up to "
            f"{PROBE_RUNS}"
        )
    ceiling["seconds"] = round(time.perf_counter() - started, 2)
    return ceiling


def _settle(ceiling: dict) -> None:
    """Each precision's ceiling: its fastest probe; float32's also as `gemm_gflops` (the
    figure earlier reports called the ceiling)."""
    for entry in ceiling["precisions"].values():
        probes = entry["probes"]
        if probes:
            fastest = max(probes, key=lambda name: probes[name]["gflops"])
            entry["gflops"] = probes[fastest]["gflops"]
            entry["from"] = fastest
        else:
            entry["gflops"] = None
    float32 = ceiling["precisions"]["float32"]
    ceiling["gemm_gflops"] = float32["gflops"]
    if float32["gflops"] is not None:
        ceiling["gemm_source"] = float32["probes"][float32["from"]]["source"]


def share_of_ceiling(gflops: float, precision: str, ceiling: dict) -> tuple[float | None, str]:
    """A row's achieved GFLOP/s as a share of the ceiling of the precision it computes in, and
    a note where there is no such ceiling or the share exceeds it."""
    entry = ceiling.get("precisions", {}).get(precision)
    if entry is None and precision == "float32" and "gemm_gflops" in ceiling:
        entry = {"gflops": ceiling["gemm_gflops"]}  # a ceiling block without precisions
    if not entry or not entry.get("gflops"):
        why = "; ".join(f"{k}: {v}" for k, v in (entry or {}).get("unavailable", {}).items())
        return None, f"no {precision} ceiling measured" + (f" ({why})" if why else "")
    share = round(gflops / entry["gflops"], 3)
    if share > 1:
        return share, (
            f"above the {precision} ceiling ({entry['gflops']} GFLOP/s): the engine's kernels "
            f"beat every {precision} probe (each one square product)"
        )
    return share, ""


def remeasure_ceiling(runtime_for: RuntimeFor, ep: str, ceiling: dict, rows: list[dict]) -> None:
    """Measure `ep`'s probes again after the timings and keep the higher of each: on a shared
    machine one measurement can land on someone else's burst of work, and a ceiling that is
    too low would flatter every fraction. The rows' fractions and memory floors on that
    provider are recomputed against the result."""
    again = measure_ceiling(runtime_for, ep, tuple(ceiling["precisions"]))
    for precision, entry in ceiling["precisions"].items():
        for name, probe in again["precisions"].get(precision, {}).get("probes", {}).items():
            before = entry["probes"].get(name)
            runs = [before["gflops"]] if before else []
            entry["probes"][name] = {**probe, "gflops": max([*runs, probe["gflops"]])}
            entry["probes"][name]["gflops_runs"] = [*runs, probe["gflops"]]
            entry["unavailable"].pop(name, None)
    _settle(ceiling)
    for key in ("numpy_gemm_gflops", "copy_bandwidth_gbs"):
        if key in again:
            ceiling[key] = max(ceiling[key], again[key])
    for row in rows:
        if row["ep"] != ep:
            continue
        if row.get("peak_fraction") is not None or row.get("peak_fraction_note"):
            share, note = share_of_ceiling(row["gflops"], row["precision"], ceiling)
            row["peak_fraction"] = share
            row.pop("peak_fraction_note", None)
            if note:
                row["peak_fraction_note"] = note
        if "weight_bytes" in row:
            row["memory_floor_ms"] = memory_floor_ms(row["weight_bytes"], ceiling)


def memory_floor_ms(weight_bytes: int, ceiling: dict) -> float:
    """The time to stream `weight_bytes` once at the measured copy bandwidth: no forward pass
    that reads every weight can be faster (the bound that matters at batch 1)."""
    return round_sig(weight_bytes / (ceiling["copy_bandwidth_gbs"] * 1e6))

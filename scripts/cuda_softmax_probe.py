"""Time Softmax (and LogSoftmax) over the last axis of the shapes the base model's graph has
at 64x128 (the output head's vocabulary, an attention's keys), on ONNX Runtime's provider and in
torch, in float16 and float32.

    python scripts/cuda_softmax_probe.py [--ep cuda] [--shape 64,128,37000 ...] [--runs 20]

Why (docs/cuda.md, run 4): bound on an H200, the float16 transformer at 64x128 spent half its
kernel time in Softmax nodes, while its share of the float16 GEMM ceiling stopped at 53 %. A
single Softmax over (batch, seq, vocabulary) reads and writes 2 x 0.6 GB in float16: at the
device's copy bandwidth that is a fraction of a millisecond (measured so: 0.53 ms), so the
next suspect is the 18 attention softmaxes, each over (64, 8, 128, 128). Each row: median ms
over `--runs` calls with inputs and outputs bound on the device, and the bandwidth that implies
(bytes read plus written), beside torch.softmax on the same tensor.
"""

# torch before onnxruntime: its CUDA libraries are the ones ONNX Runtime then finds
from __future__ import annotations  # noqa: I001

import argparse
import statistics
import time

import torch
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from tconform.runtimes.providers import DEVICE_TYPES, PROVIDERS

SHAPES = ("64,128,37000", "64,8,128,128")  # the vocabulary softmax, an attention's
ELEMENT = {"float16": TensorProto.FLOAT16, "float32": TensorProto.FLOAT}


def softmax_model(op: str, dtype: str, rank: int) -> bytes:
    """One `op` node (Softmax, LogSoftmax) over the last axis of a rank-`rank` tensor."""
    x = helper.make_tensor_value_info("x", ELEMENT[dtype], [None] * rank)
    y = helper.make_tensor_value_info("y", ELEMENT[dtype], [None] * rank)
    graph = helper.make_graph([helper.make_node(op, ["x"], ["y"], axis=-1)], op, [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    return model.SerializeToString()


def ort_ms(op: str, dtype: str, shape: tuple[int, ...], ep: str, runs: int) -> float:
    """Median ms of one bound call of the one-node model."""
    session = ort.InferenceSession(softmax_model(op, dtype, len(shape)), providers=[PROVIDERS[ep]])
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    device = DEVICE_TYPES.get(ep, "cpu")
    binding = session.io_binding()
    binding.bind_ortvalue_input("x", ort.OrtValue.ortvalue_from_numpy(x, device, 0))
    binding.bind_output("y", device)
    times = []
    for _ in range(runs + 2):
        started = time.perf_counter()
        session.run_with_iobinding(binding)  # synchronous: returns when the kernel is done
        times.append(time.perf_counter() - started)
    return statistics.median(times[2:]) * 1e3


def torch_ms(dtype: str, shape: tuple[int, ...], ep: str, runs: int) -> float:
    device = DEVICE_TYPES.get(ep, "cpu")
    x = torch.randn(shape, device=device).to(getattr(torch, dtype))
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times = []
    for _ in range(runs + 2):
        sync()
        started = time.perf_counter()
        torch.softmax(x, dim=-1)
        sync()
        times.append(time.perf_counter() - started)
    return statistics.median(times[2:]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ep", default="cuda")
    parser.add_argument("--shape", action="append", help="comma-separated (repeat) [both above]")
    parser.add_argument("--runs", type=int, default=20)
    options = parser.parse_args()
    print(f"onnxruntime {ort.__version__}, torch {torch.__version__}, {options.ep}")
    for text in options.shape or SHAPES:
        shape = tuple(int(n) for n in text.split(","))
        print(f"\n{'shape ' + text:32s} {'ms':>8s} {'GB/s':>8s}")
        for dtype in ("float16", "float32"):
            probe(shape, dtype, options)


def probe(shape: tuple[int, ...], dtype: str, options: argparse.Namespace) -> None:
    """One line per way of computing it: ms and the bandwidth it implies."""
    moved = 2 * int(np.prod(shape)) * np.dtype(dtype).itemsize  # read once, written once
    rows = [(f"ort {op} {dtype}", ort_ms(op, dtype, shape, options.ep, options.runs))
            for op in ("Softmax", "LogSoftmax")]  # fmt: skip
    rows.append((f"torch.softmax {dtype}", torch_ms(dtype, shape, options.ep, options.runs)))
    for what, ms in rows:
        print(f"{what:32s} {ms:8.3f} {moved / ms / 1e6:8.1f}")


if __name__ == "__main__":
    main()

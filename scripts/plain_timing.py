"""Re-time the whole model at base dimensions with plain onnxruntime and torch calls, outside
`tconform bench`, as a cross-check of its p50s (docs/performance.md).

    python scripts/plain_timing.py [--model artifacts/bench/base/transformer/model.onnx]
        [--batch 1] [--seq 32] [--runs 30] [--rounds 2] [--threads 2]

The model must be the bench's export (`tconform bench --case transformer` writes it). Each round
times ONNX Runtime with intra-op spinning on and off, and the torch reference in eager mode, on
the same inputs; it prints the median of `--runs` timed calls after 3 warm-up calls.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
import torch

from tconform import registry
from tconform.config import PRESETS
from tconform.export import ExportSettings, build_module
from tconform.runtimes.torch import TorchRuntime


def median_ms(run, runs: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return float(np.median(times) * 1e3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="artifacts/bench/base/transformer/model.onnx")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()

    cfg, case = PRESETS["base"], registry.get_case("transformer")
    shape = registry.Shape(args.batch, args.seq, args.seq)
    feeds = registry.make_inputs(case, cfg, shape, np.random.default_rng(0))  # as bench does

    engines = {}
    for spinning in ("1", "0"):
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.add_session_config_entry("session.intra_op.allow_spinning", spinning)
        session = ort.InferenceSession(args.model, options, providers=["CPUExecutionProvider"])
        engines[f"onnxruntime spinning={spinning}"] = lambda s=session: s.run(None, feeds)

    torch.set_num_threads(args.threads)
    _, params = build_module(case, ExportSettings(cfg))  # the export's weights
    module = TorchRuntime().open(case, cfg, params).module
    tensors = [torch.from_numpy(feeds[spec.name]) for spec in case.inputs(cfg)]

    def torch_run() -> None:
        with torch.inference_mode():
            module(*tensors)

    engines["torch eager"] = torch_run
    for round_ in range(1, args.rounds + 1):
        medians = {name: median_ms(run, args.runs) for name, run in engines.items()}
        for name, ms in medians.items():
            print(f"round {round_}  {name:28s} p50 {ms:8.2f} ms")
        ratio = medians["onnxruntime spinning=1"] / medians["torch eager"]
        print(f"round {round_}  onnxruntime / torch = {ratio:.2f}")


if __name__ == "__main__":
    main()

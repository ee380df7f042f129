"""Static int8 (activation scales calibrated once) against the dynamic int8 export, by hand:
is it a way past the 8x128 target of the speed frontier (docs/performance.md, "What is left")?

    python scripts/static_int8.py ARTIFACTS [--runs 5] [--out FOLDER]

ARTIFACTS is a bench export cache of the base preset (`tconform bench --preset base` makes
`artifacts/bench/base`, and with `--engine onnxruntime-int8` `artifacts/bench/base-int8`). The
float32 transformer is quantised by ONNX Runtime's `quantize_static` in the QDQ format
(per-tensor uint8 activations from 4 calibration batches of 2x64, int8 weights; OpenVINO 2026.4
refused to compile the per-channel variant), then timed at 1x32 and 8x128 with plain sessions
(2 threads, each runtime's defaults; the median of --runs calls after one warm-up): under ONNX
Runtime, under OpenVINO (f32 and bf16 hints), beside the dynamic int8 export and OpenVINO's
bfloat16 on the float32 export. The logits' error is against the float32 model's, with their
SQNR. The quantised model goes to --out (default: a temporary folder).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import openvino as ov
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_static,
)

VOCAB = 37000  # the base preset's shared vocabulary
SHAPES = ((1, 32), (8, 128))


def feeds(rng: np.random.Generator, batch: int, seq: int) -> dict[str, np.ndarray]:
    ids = lambda: rng.integers(3, VOCAB, (batch, seq)).astype(np.int64)  # noqa: E731
    keep = np.ones((batch, seq), bool)
    return {"src_ids": ids(), "src_keep": keep, "tgt_ids": ids(), "tgt_keep": keep}


class Calibration(CalibrationDataReader):
    def __init__(self, rng: np.random.Generator) -> None:
        self.batches = iter([feeds(rng, 2, 64) for _ in range(4)])

    def get_next(self):
        return next(self.batches, None)


def median_ms(call, runs: int) -> float:
    call()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return 1000 * float(np.median(times))


def quantised(source: Path, folder: Path, rng: np.random.Generator) -> Path:
    """The static QDQ model; the exporter's recorded shapes dropped first, as tconform's int8
    conversion does (export/quantize.py)."""
    model = onnx.load(str(source))
    del model.graph.value_info[:]
    plain, target = folder / "float32.onnx", folder / "static-int8.onnx"
    onnx.save(model, str(plain))
    quantize_static(
        str(plain), str(target), Calibration(rng), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
        op_types_to_quantize=["MatMul", "Gemm"], per_channel=False,
    )  # fmt: skip
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("artifacts", type=Path)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    float32 = args.artifacts / "transformer" / "model.onnx"
    dynamic = Path(f"{args.artifacts}-int8") / "transformer" / "model.onnx"
    rng = np.random.default_rng(0)
    folder = args.out or Path(tempfile.mkdtemp())
    folder.mkdir(parents=True, exist_ok=True)
    static = quantised(float32, folder, rng)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    core = ov.Core()
    for batch, seq in SHAPES:
        x = feeds(rng, batch, seq)
        reference = ort.InferenceSession(str(float32), options, providers=["CPUExecutionProvider"])
        expected = reference.run(["logits"], x)[0]
        engines = {
            f"onnxruntime {kind} int8": (
                ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"]),
                None,
            )
            for kind, path in (("dynamic", dynamic), ("static", static))
            if path.is_file()
        }
        for model, hint in ((static, "f32"), (static, "bf16"), (float32, "bf16")):
            config = {"INFERENCE_PRECISION_HINT": hint, "INFERENCE_NUM_THREADS": 2}
            compiled = core.compile_model(str(model), "CPU", config)
            kind = "static int8" if model == static else "float32 export"
            engines[f"openvino {kind}, {hint} hint"] = (compiled.create_infer_request(), compiled)
        for name, (session, compiled) in engines.items():
            if compiled is None:
                run = lambda s=session, x=x: s.run(["logits"], x)[0]  # noqa: E731
            else:
                run = lambda s=session, c=compiled, x=x: s.infer(x)[c.output("logits")]  # noqa: E731
            ms = median_ms(run, args.runs)
            logits = run()
            error = logits - expected
            sqnr = 10 * np.log10(np.sum(expected**2) / max(np.sum(error**2), 1e-300))
            print(
                f"{batch}x{seq}  {name:40s} p50 {ms:8.1f} ms  max abs err vs float32 "
                f"{np.abs(error).max():.3g}  SQNR {sqnr:.1f} dB",
                flush=True,
            )


if __name__ == "__main__":
    main()

"""Reproduce the goldens with nothing of tconform: only onnx, onnxruntime and numpy.

For every case in golden/manifest.json, load artifacts/<case>/model.onnx, feed each
golden/<case>/test_data_set_N/input_K.pb, and compare with output_K.pb under the tolerance the
manifest records for that case. Runs ONNX Runtime (CPU) and, with --reference, onnx's
ReferenceEvaluator as a second runtime.

    python scripts/independent_check.py [--golden golden] [--artifacts artifacts] [--reference]

Exit 0 when every output is within tolerance on every runtime, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator


def load_tensors(folder: Path, kind: str) -> list[np.ndarray]:
    files = sorted(folder.glob(f"{kind}_*.pb"), key=lambda p: int(p.stem.split("_")[1]))
    tensors = []
    for path in files:
        proto = onnx.TensorProto()
        proto.ParseFromString(path.read_bytes())
        tensors.append(numpy_helper.to_array(proto))
    return tensors


def worst_ratio(actual: np.ndarray, golden: np.ndarray, tol: dict) -> float:
    """max |a - g| / (atol + rtol*|g|); > 1 means out of tolerance. NaN anywhere is a failure.
    The atol stands for outputs of RMS atol_rms: on a golden of a smaller RMS it shrinks in
    proportion; on one whose typical size (the smaller of its RMS and its nonzero values'
    median magnitude) is over ten times it, it grows so (docs/tolerances.md)."""
    a, g = actual.astype(np.float64), golden.astype(np.float64)
    if actual.shape != golden.shape or np.isnan(a).any() != np.isnan(g).any():
        return float("inf")
    finite = g[np.isfinite(g)]
    rms = float(np.sqrt(np.mean(finite**2))) if finite.size else 0.0
    scale = tol.get("atol_rms")  # absent: a manifest from before the rule, atol as given
    grown_above = 10.0  # and beyond ten times that scale it grows in proportion
    nonzero = np.abs(finite[finite != 0])
    typical = min(rms, float(np.median(nonzero))) if nonzero.size else rms
    ratio = rms / scale if rms and scale else 1.0
    grown = typical / scale / grown_above if scale else 1.0
    atol = tol["atol"] * (ratio if ratio < 1 else max(1.0, grown))
    return float(np.max(np.abs(a - g) / (atol + tol["rtol"] * np.abs(g)), initial=0.0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--golden", type=Path, default=Path("golden"))
    parser.add_argument("--artifacts", type=Path, default=Path("artifacts"))
    parser.add_argument("--reference", action="store_true", help="also run ReferenceEvaluator")
    args = parser.parse_args()

    manifest = json.loads((args.golden / "manifest.json").read_text())
    failures = 0
    for case, entry in manifest["cases"].items():
        tol = manifest["tolerances"][f"float32/{entry['tolerance_class']}"]
        model_path = args.artifacts / case / "model.onnx"
        runtimes = {
            "onnxruntime": onnxruntime.InferenceSession(
                str(model_path), providers=["CPUExecutionProvider"]
            )
        }
        if args.reference:
            runtimes["reference"] = ReferenceEvaluator(onnx.load(str(model_path)))
        for folder in sorted((args.golden / case).glob("test_data_set_*")):
            inputs = load_tensors(folder, "input")
            goldens = load_tensors(folder, "output")
            feeds = dict(zip(entry["inputs"], inputs, strict=True))
            for name, runtime in runtimes.items():
                outputs = runtime.run(None, feeds)
                ratio = max(worst_ratio(o, g, tol) for o, g in zip(outputs, goldens, strict=True))
                status = "pass" if ratio <= 1 else "FAIL"
                failures += status == "FAIL"
                print(f"{case:20s} {folder.name:16s} {name:12s} tol used {ratio:7.2%} {status}")
    print(f"{failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""What other quantize_dynamic settings and ONNX Runtime session settings would buy the int8
graph, measured beside the verify dtype's settings (docs/performance.md, "int8 on the AMD EPYC").

    python scripts/int8_options.py FLOAT32_MODEL.onnx [--shape 1x32] [--seconds 4] [--json OUT]

FLOAT32_MODEL is the bench's plain float32 export of the whole model (`<artifacts>/transformer/
model.onnx`). Each variant quantises it with `onnxruntime.quantization.quantize_dynamic`
(`INT8_QUANTIZATION` with one setting changed) and times it through the bench's runtime
(threads = physical cores, the bench's session config) on the bench's inputs; a session
variant times the verify dtype's graph with another graph-optimisation level. Each is judged
against the float64 oracle under the int8 model row, since a faster graph that leaves the row is
no option. The verify dtype's settings are not changed by this: reduce_range stays on there,
because full-range weights saturate ONNX Runtime's int8 kernels on CPUs without VNNI
(tconform/export/settings.py).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

from tconform import registry
from tconform.bench.accuracy import judge_outputs
from tconform.bench.engines import open_engine
from tconform.bench.run import bench_settings
from tconform.bench.timing import latency_stats, timed_runs
from tconform.config import get_preset
from tconform.execution import Subject
from tconform.export import ExportSettings, build_module
from tconform.export.quantize import quiet_quantizer
from tconform.export.settings import INT8_QUANTIZATION
from tconform.models import derived_file
from tconform.registry import Shape

# name -> (quantize_dynamic arguments over INT8_QUANTIZATION, --graph-opt)
VARIANTS = {
    "verify settings (QInt8, per_channel, reduce_range)": ({}, "all"),
    "per-tensor scales (per_channel=False)": ({"per_channel": False}, "all"),
    "full-range weights (reduce_range=False)": ({"reduce_range": False}, "all"),
    "uint8 weights (QUInt8: the U8U8 kernel)": ({"weight_type": "QUInt8"}, "all"),
    "verify settings, graph-opt extended": ({}, "extended"),
    "verify settings, graph-opt basic": ({}, "basic"),
}


def quantized(source: Path, target: Path, changes: dict) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    settings = {**INT8_QUANTIZATION, **changes}
    weight_type = getattr(QuantType, str(settings.pop("weight_type")))
    with quiet_quantizer():
        quantize_dynamic(source, target, weight_type=weight_type, **settings)
    return target


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", type=Path)
    parser.add_argument("--shape", default="1x32")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    batch, seq = (int(n) for n in args.shape.split("x"))
    cfg = get_preset("base")
    (case,) = registry.select_cases(["transformer"])
    _, params = build_module(case, ExportSettings(cfg))
    feeds = registry.make_inputs(case, cfg, Shape(batch, seq, seq), np.random.default_rng(0))
    names = [spec.name for spec in case.outputs(cfg)]
    golden = dict(zip(names, registry.run_oracle(case, cfg, params, feeds), strict=True))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        made: dict[str, Path] = {}
        for name, (changes, graph_opt) in VARIANTS.items():
            key = json.dumps(changes, sort_keys=True)
            if key not in made:
                made[key] = quantized(args.model, Path(tmp) / f"q{len(made)}.onnx", changes)
            settings = bench_settings(
                "base", ("transformer",), (), ("onnxruntime",), "cpu", 0,
                {"graph_opt": graph_opt}, 2, None, args.seconds, Path(tmp),
            )  # fmt: skip
            runtime = settings.runtime("onnxruntime", "cpu")
            call = open_engine(runtime, Subject(derived_file(made[key])), feeds)
            stats = latency_stats(timed_runs(call.run, 2, None, args.seconds))
            judged = judge_outputs(call.outputs(), golden, "int8", case.tolerance)
            call.close()
            row = {
                "variant": name,
                "quantize_dynamic": {**INT8_QUANTIZATION, **changes},
                "graph_opt": graph_opt,
                "p50_ms": round(stats.p50_ms, 2),
                "p90_ms": round(stats.p90_ms, 2),
                "runs": stats.runs,
                "weight_bytes": call.weight_bytes(batch * seq),
                "int8_row": judged["status"],
                "max_abs_err": round(judged["max_abs_err"], 4),
                "sqnr_db": judged["sqnr_db"],
            }
            rows.append(row)
            print(
                f"{name}: p50 {row['p50_ms']} ms (p90 {row['p90_ms']}, {row['runs']} runs), "
                f"int8 row {row['int8_row']}, max|err| {row['max_abs_err']}, "
                f"SQNR {row['sqnr_db']} dB",
                flush=True,
            )
    if args.json:
        args.json.write_text(json.dumps({"shape": args.shape, "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""How fast the whole model's matrix products alone run in ONNX Runtime: a lower bound on any
float32 graph of the model with this runtime's GEMM, to judge a bench report's targets by
(docs/performance.md, "What the matrix products alone take").

    python scripts/matmul_bound.py BENCH.json [--runs 30] [--json OUT.json]

For every `transformer` entry of the report's `best` list (CPU), it builds an ONNX graph that is
nothing but the model's weight products in order: per encoder layer the Q, K, V and output
projections and both FFN products, per decoder layer those of self- and cross-attention and
the FFN, then the output head; each with its own float32 weight of the model's size (252 MB at
base, read from memory as the model reads its own). The per-head Q K^T and A V products,
softmax, masks, norms, residuals and bias adds are left out, so the figure is below what any
graph of the model can reach with these GEMMs. It is timed with the bench's preset, threads and
session config (best and median of --runs after 3 warm-ups), and set beside the report's own
p50s: ONNX Runtime's best variant, torch eager and the memory floor.
"""

from __future__ import annotations

import json
import tempfile
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import onnx
from bench_report import read_bench_report
from onnx import TensorProto, helper, numpy_helper

from tconform.bench.timing import timed_runs
from tconform.config import ModelConfig, get_preset
from tconform.costs import transformer_flops
from tconform.execution import Subject, open_subject
from tconform.models import derived_file
from tconform.runtimes.onnxruntime import OrtRuntime


def weight_products(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(d_in, d_out) of every weight product of the whole model, in the order it runs them."""
    d, ff = cfg.d_model, cfg.d_ff
    feed_forward = [(d, ff), (ff, d)]
    encoder_layer = [(d, d)] * 4 + feed_forward
    decoder_layer = [(d, d)] * 8 + feed_forward  # self- and cross-attention projections
    return encoder_layer * cfg.n_layers + decoder_layer * cfg.n_layers + [(d, cfg.tgt_vocab)]


def products_model(products: list[tuple[int, int]], path: Path) -> None:
    """X @ W_1 @ W_2 ... with one weight per product, scaled to keep activations near 1
    (shrinking ones would reach subnormal floats, which are slow and would flatter nothing)."""
    rng = np.random.default_rng(0)
    nodes, weights, x = [], [], "x"
    for i, (d_in, d_out) in enumerate(products):
        w = rng.standard_normal((d_in, d_out), dtype=np.float32) / np.float32(np.sqrt(d_in))
        weights.append(numpy_helper.from_array(w, f"w{i}"))
        nodes.append(helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"]))
        x = f"y{i}"
    graph = helper.make_graph(
        nodes,
        "weight_products",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", products[0][0]])],
        [helper.make_tensor_value_info(x, TensorProto.FLOAT, ["rows", products[-1][1]])],
        weights,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)
    onnx.save(model, str(path))


def main() -> None:
    args, report = read_bench_report(__doc__.splitlines()[0], runs=30)
    settings = report["settings"]
    cfg = get_preset(settings["preset"])
    products = weight_products(cfg)
    runtime = OrtRuntime(
        threads=settings["intra_op_threads"],
        session_config=settings.get("session_config", {}),
    )
    rows = []
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        path = Path(tmp) / "weight_products.onnx"
        products_model(products, path)
        opened = stack.enter_context(open_subject(runtime, Subject(derived_file(path))))
        entries = (b for b in report["best"] if b["case"] == "transformer" and b["ep"] == "cpu")
        for best in entries:
            batch, seq = best["batch"], best["seq"]
            rows_in = batch * seq
            flop = sum(2 * rows_in * d_in * d_out for d_in, d_out in products)
            # The count the bench uses, less the per-head products this graph leaves out.
            per_head = cfg.n_layers * 3 * 4 * batch * seq * seq * cfg.d_model
            assert flop + per_head == transformer_flops(cfg, batch, seq, seq), "product list"
            x = np.random.default_rng(1).standard_normal((rows_in, cfg.d_model), np.float32)
            runs = args.runs if rows_in <= 256 else max(3, args.runs // 6)
            call = opened.timed_call({"x": x})
            times = timed_runs(call.run, warmup=3, runs=runs)
            best_ms, median_ms = min(times) * 1e3, float(np.median(times)) * 1e3
            row = {
                "case": "transformer", "batch": batch, "seq": seq,
                "products": len(products), "gflop": round(flop / 1e9, 3),
                "weight_mb": round(sum(a * b for a, b in products) * 4 / 1e6, 1),
                "best_ms": round(best_ms, 2), "median_ms": round(median_ms, 2), "runs": runs,
                "gflops": round(flop / best_ms / 1e6, 1),
                "bench_best_engine": best["best_engine"], "bench_p50_ms": best["p50_ms"],
                "torch_p50_ms": best.get("torch_p50_ms"),
                "memory_floor_ms": best.get("memory_floor_ms"),
            }  # fmt: skip
            rows.append(row)
            what = f"transformer {batch}x{seq}"
            print(
                f"{what}: {len(products)} weight products, {row['gflop']} GFLOP, "
                f"{row['weight_mb']} MB: best {row['best_ms']} ms, median {row['median_ms']} ms "
                f"({row['gflops']} GFLOP/s)"
            )
            print(f"{what}: = {best_ms / best['p50_ms']:.2f}x the bench's best ORT p50")
            references = (("torch eager p50", "torch_p50_ms"), ("memory floor", "memory_floor_ms"))
            for name, key in references:
                if row[key]:
                    print(f"{what}: = {best_ms / row[key]:.2f}x the {name} ({row[key]} ms)")
    if args.json:
        record = {"bench": str(args.bench), "settings": runtime.settings(), "rows": rows}
        args.json.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()

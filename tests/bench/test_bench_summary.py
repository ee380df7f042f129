"""The best-variant summary: per case, shape and provider the fastest ONNX Runtime graph, its
gain over the plain export and its ratios to torch eager and the memory floor."""

from __future__ import annotations

import pytest

from tconform.bench.summary import best_variants, summary_lines

pytestmark = pytest.mark.unit


def row(engine: str, p50: float, batch: int = 1, status: str = "pass", **extra) -> dict:
    return {
        "case": "transformer", "engine": engine, "ep": "cpu", "batch": batch, "seq": 32,
        "status": status, "p50_ms": p50, "peak_fraction": 0.5,
        "details": {"attention": "sdpa" if "sdpa" in engine else "plain"}, **extra,
    }  # fmt: skip


def test_the_fastest_variant_and_its_gain_over_plain():
    rows = [
        row("onnxruntime", 30.0, memory_floor_ms=10.0),
        row("onnxruntime-sdpa", 24.0, memory_floor_ms=10.0, outside_matmul_share=0.1),
        row("torch", 60.0),
        row("torch-compile", 20.0),  # faster, but not an ONNX Runtime variant
        row("onnxruntime-fused", 1.0, status="skip"),  # skipped rows never win
    ]
    (best,) = best_variants(rows)
    assert best["best_engine"] == "onnxruntime-sdpa" and best["attention"] == "sdpa"
    assert best["gain_over_plain"] == pytest.approx(30 / 24, abs=1e-3)
    assert best["vs_torch"] == pytest.approx(0.4)
    assert best["vs_memory_floor"] == pytest.approx(2.4)
    assert best["outside_matmul_share"] == 0.1
    (line,) = summary_lines([best])
    assert "best onnxruntime-sdpa" in line and "1.25x faster than plain" in line


def test_one_entry_per_shape_and_none_without_an_onnx_runtime_row():
    rows = [row("onnxruntime", 5.0), row("onnxruntime", 50.0, batch=8), row("torch", 9.0, batch=4)]
    summary = best_variants(rows)
    assert [(s["batch"], s["best_engine"], s["gain_over_plain"]) for s in summary] == [
        (1, "onnxruntime", 1.0),
        (8, "onnxruntime", 1.0),
    ]
    assert "vs_torch" not in summary[0]


def test_an_int8_graph_enters_best_with_its_dtype_its_own_floor_and_its_verdict():
    int8_details = {"attention": "plain", "dtype": "int8"}
    rows = [
        row("onnxruntime", 30.0, memory_floor_ms=10.0, accuracy={"status": "pass"}),
        row("onnxruntime-int8", 12.0, memory_floor_ms=3.0, accuracy={"status": "fail"}),
        row("torch", 60.0),
        row("torch-int8", 8.0),  # a module runtime, not a graph variant
    ]
    rows[1]["details"] = int8_details
    (best,) = best_variants(rows)
    assert (best["best_engine"], best["dtype"]) == ("onnxruntime-int8", "int8")
    assert best["vs_memory_floor"] == pytest.approx(4.0)  # 12 ms over its own 3 ms floor
    assert best["accuracy"] == "fail"
    (line,) = summary_lines([best])
    assert "outputs judged: fail" in line

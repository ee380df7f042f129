"""The best-variant summary: per case, shape and provider the fastest verified graph variant,
the precision it ran in, its gain over the plain export and its ratios to torch eager float32,
to the fastest verified torch engine and to its own memory floor."""

from __future__ import annotations

import pytest

from tconform.bench.summary import best_variants, summary_lines

pytestmark = pytest.mark.unit


def row(engine: str, p50: float, batch: int = 1, status: str = "pass", **extra) -> dict:
    return {
        "case": "transformer", "engine": engine, "ep": "cpu", "batch": batch, "seq": 32,
        "status": status, "p50_ms": p50, "peak_fraction": 0.5,
        "details": {"attention": "sdpa" if "sdpa" in engine else "plain"},
        "accuracy": {"status": "pass"}, **extra,
    }  # fmt: skip


def test_the_fastest_variant_and_its_gain_over_plain():
    rows = [
        row("onnxruntime", 30.0, memory_floor_ms=10.0),
        row("onnxruntime-sdpa", 24.0, memory_floor_ms=10.0, outside_matmul_share=0.1),
        row("torch", 60.0),
        row("torch-compile", 20.0),  # faster, but not an ONNX Runtime variant
        row("onnxruntime-fused", 1.0, status="skip"),  # skipped rows never win
        row("onnxruntime-int8", 2.0, accuracy={}),  # nor rows whose outputs were not judged
    ]
    (best,) = best_variants(rows)
    assert best["best_engine"] == "onnxruntime-sdpa" and best["attention"] == "sdpa"
    assert best["gain_over_plain"] == pytest.approx(30 / 24, abs=1e-3)
    assert best["vs_torch"] == pytest.approx(0.4)
    assert best["vs_memory_floor"] == pytest.approx(2.4)
    assert best["outside_matmul_share"] == 0.1
    (line,) = summary_lines([best])
    assert "best onnxruntime-sdpa" in line and "1.25x faster than onnxruntime (30.0" in line


def test_a_release_of_a_variant_can_be_the_best():
    rows = [row("onnxruntime", 1.18), row("onnxruntime==1.20.1", 1.10), row("torch", 2.0)]
    (best,) = best_variants(rows)
    assert best["best_engine"] == "onnxruntime==1.20.1"
    assert best["gain_over_plain"] == pytest.approx(1.18 / 1.10, abs=1e-3)
    (line,) = summary_lines([best])  # faster than the installed release's plain graph
    assert "1.07x faster than onnxruntime (1.18 ms)" in line


def test_one_entry_per_shape_and_none_without_an_onnx_runtime_row():
    rows = [row("onnxruntime", 5.0), row("onnxruntime", 50.0, batch=8), row("torch", 9.0, batch=4)]
    summary = best_variants(rows)
    assert [(s["batch"], s["best_engine"], s["gain_over_plain"]) for s in summary] == [
        (1, "onnxruntime", 1.0),
        (8, "onnxruntime", 1.0),
    ]
    assert "vs_torch" not in summary[0]


def test_the_fastest_verified_variant_wins_and_names_the_precision_it_ran_in():
    rows = [
        row("onnxruntime", 30.0, memory_floor_ms=10.0, accuracy={"status": "pass"}),
        row("onnxruntime-int8", 12.0, memory_floor_ms=3.0, accuracy={"status": "pass"}),
        row("onnxruntime-int4", 9.0, accuracy={"status": "fail"}),  # faster, not verified
        row("torch", 60.0, accuracy={"status": "pass"}),
        row("torch-int8", 15.0, accuracy={"status": "pass"}),  # a module runtime: the peer
        row("torch-bf16", 10.0, accuracy={"status": "fail"}),  # fastest torch, not verified
    ]
    rows[1].update(precision="int8", details={"attention": "plain", "dtype": "int8"})
    (best,) = best_variants(rows)
    assert (best["best_engine"], best["dtype"]) == ("onnxruntime-int8", "int8")
    assert best["vs_memory_floor"] == pytest.approx(4.0)  # 12 ms over its own 3 ms floor
    assert best["vs_torch"] == pytest.approx(0.2)  # torch eager float32
    assert (best["best_torch_engine"], best["vs_best_torch"]) == ("torch-int8", 0.8)
    (line,) = summary_lines([best])
    assert "best onnxruntime-int8 (int8)" in line and "0.20x torch eager float32" in line
    assert "0.80x the fastest verified torch engine (torch-int8" in line


def test_bf16_names_bfloat16_though_its_export_is_float32():
    rows = [row("openvino-bf16", 5.0, precision="bfloat16"), row("onnxruntime", 9.0)]
    rows[0]["details"] = {"attention": "plain", "dtype": "float32"}
    (best,) = best_variants(rows)
    assert (best["best_engine"], best["dtype"], best["export_dtype"]) == (
        "openvino-bf16", "bfloat16", "float32",
    )  # fmt: skip
    assert "best openvino-bf16 (bfloat16)" in summary_lines([best])[0]


@pytest.mark.parametrize("status", ["fail", "skip", None])
def test_no_variant_whose_outputs_did_not_pass_is_ever_best(status):
    """README: a row whose outputs left their tolerance row never enters `best`; nor one whose
    outputs were skipped or not judged. Where no variant passed there is no best at all."""
    accuracy = {"status": status} if status else {}
    rows = [row("onnxruntime", 5.0, accuracy=accuracy), row("torch", 9.0)]
    assert best_variants(rows) == []
    rows.append(row("onnxruntime==1.20.1", 6.0))  # slower, but its outputs passed
    (best,) = best_variants(rows)
    assert best["best_engine"] == "onnxruntime==1.20.1"


def test_a_ratio_far_below_one_keeps_its_digits():
    from tconform.bench.summary import ratio

    assert ratio(0.45) == "0.45" and ratio(13.09) == "13.09"
    assert ratio(0.0016) == "0.0016"  # microseconds against torch's milliseconds, not "0.00"
    # and the summary keeps them so: a ratio rounded to places was "0x torch eager float32"
    (best,) = best_variants([row("onnxruntime", 0.11), row("torch", 350.0)])
    assert best["vs_torch"] == pytest.approx(0.11 / 350, rel=1e-2)
    assert "0.00031x torch eager float32" in summary_lines([best])[0]


@pytest.mark.parametrize(
    ("load", "busy"),
    [
        ({"cores": 2, "threads": 2, "at_start": 0.2, "at_end": 2.1}, False),  # its own load
        ({"cores": 2, "threads": 2, "at_start": 1.9, "at_end": 2.4}, True),  # others at start
        ({"cores": 2, "threads": 1, "at_start": 0.1, "at_end": 2.5}, True),  # others meanwhile
        ({"cores": 2, "threads": 2, "at_start": None, "at_end": None}, False),  # none kept
        ({}, False),  # a report from before the load was recorded
        ({"cores": 2, "threads": 2, "at_start": 3.6}, True),  # a run that ended early
    ],
)
def test_a_busy_machine_is_said_beside_the_timings(load, busy):
    from tconform.bench.report import load_lines

    lines = load_lines(load)
    assert bool(lines) == busy
    assert all("not a quiet machine's" in line and "None" not in line for line in lines)


def test_a_row_bound_on_the_device_is_its_variant_and_gains_over_the_bound_plain_row():
    """On a GPU each ONNX Runtime variant has an IO-binding row beside its numpy one (seen on an
    H200: float16 at 64x128, 77 ms copying its outputs to the host, 6.5 ms bound): the bound row
    is the variant as a deployment runs it, compared with the plain graph's bound row."""
    rows = [
        row("onnxruntime", 270.0, ep="cuda"),
        row("onnxruntime-iobinding", 29.0, ep="cuda"),
        row("onnxruntime-fp16", 77.0, ep="cuda"),
        row("onnxruntime-fp16-iobinding", 6.5, ep="cuda"),
        row("torch", 30.0, ep="cuda"),
    ]
    (best,) = best_variants(rows)
    assert best["best_engine"] == "onnxruntime-fp16-iobinding"
    assert (best["plain_p50_ms"], best["gain_over_plain"]) == (
        29.0,
        pytest.approx(29 / 6.5, abs=1e-3),
    )
    assert best["vs_torch"] == pytest.approx(6.5 / 30, abs=1e-3)


def test_two_releases_of_an_engine_are_compared_in_the_json_and_the_lines():
    from tconform.bench.report import BenchReport, version_lines

    rows = [row("onnxruntime==1.20.1", 2.0), row("onnxruntime", 1.5), row("torch", 3.0)]
    report = BenchReport(data={"results": rows}).to_dict()
    (versions,) = report["versions"]
    assert versions["engine"] == "onnxruntime" and versions["shape"] == "1x32"
    assert versions["p50_ms"] == {"onnxruntime==1.20.1": 2.0, "onnxruntime": 1.5}
    assert versions["to_first"] == {"onnxruntime==1.20.1": 1.0, "onnxruntime": 0.75}
    (line,) = version_lines(report)
    assert "versions of onnxruntime, p50: onnxruntime==1.20.1 2.0 ms (1.00x)" in line


def test_bench_generate_puts_an_engines_releases_side_by_side():
    """`bench --generate --engine onnxruntime==1.20.1 --engine onnxruntime`: the JSON's
    `versions` and the summary compare the releases' cached step, as bench's rows do."""
    from tconform.bench.generate import GenerateReport
    from tconform.bench.report import version_lines

    report = GenerateReport()
    report.data["rows"] = [
        {"engine": "onnxruntime==1.20.1", "ep": "cpu", "cached_p50_ms": 2.0},
        {"engine": "onnxruntime", "ep": "cpu", "cached_p50_ms": 1.0},
        {"engine": "torch", "ep": "cpu", "cached_p50_ms": 3.0},  # one release: no comparison
    ]
    (compared,) = report.to_dict()["versions"]
    assert compared["engine"] == "onnxruntime" and compared["to_first"]["onnxruntime"] == 0.5
    assert version_lines(report.to_dict()) == [
        "generation cached step cpu: versions of onnxruntime, p50: onnxruntime==1.20.1 2.0 ms "
        "(1.00x), onnxruntime 1.0 ms (0.50x)"
    ]

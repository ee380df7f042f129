"""`tconform bench` end to end on the tiny preset: bad input is a one-line usage error (exit 2)
before anything slow starts, and a short run writes JSON, markdown and a plot of the documented
shape. No timing assertions."""

from __future__ import annotations

import json

import pytest

from tconform.bench import ceiling
from tconform.commands.bench import bench
from tconform.errors import EXIT_USAGE

pytestmark = pytest.mark.integration


def run_bench(*args: str) -> None:
    """bench in this process; it ends, like every checking command, with its exit code."""
    try:
        bench.main(list(args), standalone_mode=False, prog_name="tconform bench")
    except SystemExit as exc:
        assert exc.code == 0, exc.code


@pytest.mark.parametrize(
    "args, message",
    [
        (["--engine", "tensorrt"], "unknown engine 'tensorrt'"),
        (["--ep", "rocm"], "unknown execution provider 'rocm'"),
        (["--shape", "1x13"], "exceeds the preset's 12"),
        (["--shape", "8by128"], "is not BATCHxSEQ"),
        (["--shape", "0x4"], "batch must be 1.."),
        (["--shape", "99999999999999999999x1"], "batch must be 1..65536"),
        (["--shape", "1x" + "9" * 5000], "sequence 1..999999999"),
        (["--case", "nonexistent"], "unknown case"),
        (["--preset", "huge"], "'huge' is not one of"),
        (["--seconds", "0"], "--seconds"),
        (["--threads", "0"], "--threads"),
        (["--plot", "bench.jpg"], "must end in .png"),
        # what --generate would pass over, and decoding options without it
        (["--generate", "3", "--case", "norm"], "--case: not taken by --generate"),
        (["--generate", "3", "--shape", "1x4"], "--shape: not taken by --generate"),
        (
            ["--generate", "3", "--top-k", "3"],
            "--top-k: not taken by --generate with --strategy greedy",
        ),
        (["--top-k", "3"], "--top-k: with --generate only"),
    ],
)
def test_bad_input_is_a_one_line_usage_error(cli, args, message, tmp_path):
    code, _, err = cli("bench", "--preset", "tiny", "--artifacts", str(tmp_path / "a"), *args)
    assert code == EXIT_USAGE and message in err and "Traceback" not in err, err
    assert not (tmp_path / "a").exists()  # refused before exporting anything


def test_a_shape_beyond_this_machines_memory_is_refused_up_front(cli, tmp_path):
    code, _, err = cli(
        "bench", "--case", "transformer", "--shape", "60000x256", "--artifacts", str(tmp_path)
    )
    assert code == EXIT_USAGE and "GiB are available here" in err
    assert not any(tmp_path.iterdir())


def test_compare_refuses_a_json_from_another_tool(cli, tmp_path):
    other = tmp_path / "verify.json"
    other.write_text(json.dumps({"tool": "tconform verify", "results": []}))
    code, _, err = cli("bench", "--compare", str(other), str(other))
    assert code == EXIT_USAGE and "not a tconform bench report" in err


RESULT_KEYS = {
    "case", "engine", "ep", "batch", "seq", "p50_ms", "p90_ms", "p99_ms", "mean_ms", "std_ms",
    "runs", "tokens_per_s", "gflops", "peak_fraction", "peak_mem_mb",
}  # fmt: skip


def test_short_run_writes_the_documented_reports(tmp_path, monkeypatch, capsys):
    # A small ceiling measurement keeps the test fast; its value is not asserted.
    monkeypatch.setattr(ceiling, "GEMM_SIZE", 128)
    monkeypatch.setattr(ceiling, "COPY_BYTES", 2**20)
    out = tmp_path / "bench.json"
    run_bench(
        "--preset", "tiny", "--case", "feed_forward", "--shape", "1x4", "--shape", "2x6",
        "--engine", "onnxruntime", "--engine", "torch", "--ep", "cpu", "--threads", "1",
        "--warmup", "1", "--runs", "3", "--artifacts", str(tmp_path / "artifacts"),
        "--json", str(out), "--markdown", str(tmp_path / "bench.md"),
        "--plot", str(tmp_path / "bench.png"), "--profile", "--skip-layer-norm-fusion", "-q",
    )  # fmt: skip
    stdout, stderr = capsys.readouterr()
    assert stderr == ""  # -q: no progress lines and no bar
    report = json.loads(out.read_text())
    assert {"environment", "ceiling", "results"} <= set(report)
    assert report["settings"]["disabled_optimizers"] == {"cpu": []}  # --skip-layer-norm-fusion
    assert report["ceiling"]["gemm_gflops"] > 0
    # float32 engines only: the float32 ceiling, the best of its probes, and no other
    (precision,) = report["ceiling"]["precisions"]
    assert report["ceiling"]["precisions"][precision]["gflops"] == report["ceiling"]["gemm_gflops"]
    assert report["settings"]["intra_op_threads"] == report["settings"]["torch_threads"] == 1
    rows = report["results"]
    assert {(r["engine"], r["batch"], r["seq"]) for r in rows} == {
        ("onnxruntime", 1, 4), ("torch", 1, 4), ("onnxruntime", 2, 6), ("torch", 2, 6),
    }  # fmt: skip
    for row in rows:
        assert set(row) >= RESULT_KEYS
        assert row["runs"] == 3 and row["precision"] == "float32"
        assert row["p50_ms"] <= row["p90_ms"] <= row["p99_ms"]
        assert row["tokens_per_s"] == pytest.approx(
            row["batch"] * row["seq"] / (row["p50_ms"] / 1e3), rel=1e-3
        )
    onnx_row = next(r for r in rows if r["engine"] == "onnxruntime")
    assert "MatMul" in onnx_row["profile"]
    assert "feed_forward" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert "onnxruntime p50 / torch p50" in stdout
    assert {r["status"] for r in rows} == {"pass"}
    # stdout, JSON and markdown show the same share of the (final) ceiling.
    for row in rows:
        assert f"{100 * row['peak_fraction']:.0f}%" in stdout
        assert f"{100 * row['peak_fraction']:.0f}%" in (tmp_path / "bench.md").read_text()
    # The same report compared with itself: every row a ratio of 1, labelled noise.
    run_bench("--compare", str(out), str(out))
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 + len(rows)  # header, rule, one line per row
    assert all(line.endswith("noise") and " 1.000 " in line for line in lines[2:])


def test_graph_variants_are_engines_and_the_report_names_the_best(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ceiling, "GEMM_SIZE", 128)
    monkeypatch.setattr(ceiling, "COPY_BYTES", 2**20)
    out = tmp_path / "bench.json"
    run_bench(
        "--preset", "tiny", "--case", "mha_self", "--shape", "1x4",
        "--engine", "onnxruntime", "--engine", "onnxruntime-sdpa", "--engine", "torch",
        "--ep", "cpu", "--threads", "1", "--warmup", "1", "--runs", "3", "--profile",
        "--artifacts", str(tmp_path / "bench"), "--json", str(out),
    )  # fmt: skip
    report = json.loads(out.read_text())
    assert report["settings"]["session_config"] == {
        "session.intra_op.allow_spinning": "1",
        "session.set_denormal_as_zero": "1",
    }
    assert report["settings"]["disabled_optimizers"] == {"cpu": ["SkipLayerNormFusion"]}
    rows = {r["engine"]: r for r in report["results"]}
    assert rows["onnxruntime"]["details"]["attention"] == "plain"
    sdpa = rows["onnxruntime-sdpa"]
    assert sdpa["details"]["attention"] == "sdpa"
    assert sdpa["details"]["model"] == str(tmp_path / "bench-sdpa" / "mha_self" / "model.onnx")
    assert "Attention" in sdpa["profile"] and "Softmax" not in sdpa["profile"]
    assert 0 < sdpa["outside_matmul_share"] < 1
    (best,) = report["best"]
    fastest = min(("onnxruntime", "onnxruntime-sdpa"), key=lambda e: rows[e]["p50_ms"])
    assert best["best_engine"] == fastest
    assert best["gain_over_plain"] == pytest.approx(
        rows["onnxruntime"]["p50_ms"] / rows[fastest]["p50_ms"], abs=1e-3
    )
    assert f"best {fastest} (float32) p50" in capsys.readouterr().out

"""`bench --compare`: ratios, the noise rule and refusal of files that are not bench reports."""

from __future__ import annotations

import json

import pytest

from tconform.bench.compare import (
    MIN_CHANGE,
    compare_reports,
    compare_table,
    load_report,
    verdict,
)
from tconform.bench.run import SCHEMA
from tconform.errors import UsageError

pytestmark = pytest.mark.unit


def report(p50: float, std: float, runs: int = 25, mean: float | None = None) -> dict:
    row = {
        "case": "transformer",
        "engine": "onnxruntime",
        "ep": "cpu",
        "batch": 1,
        "seq": 32,
        "status": "pass",
        "p50_ms": p50,
        "mean_ms": mean or p50,
        "std_ms": std,
        "runs": runs,
    }
    return {"schema": SCHEMA, "results": [row]}


def test_steady_runs_make_a_ten_percent_slowdown_a_regression():
    rows = compare_reports(report(40.0, 0.4), report(44.0, 0.4))
    assert rows[0]["ratio"] == pytest.approx(1.1)
    assert rows[0]["verdict"] == "regression"


def test_noisy_runs_make_the_same_slowdown_noise():
    # std 50% of the mean over 4 runs: relative error 0.25 per side, 3 sigma ~ 1.06.
    rows = compare_reports(report(40.0, 20.0, runs=4), report(44.0, 22.0, runs=4))
    assert rows[0]["noise"] == pytest.approx((0.25**2 + 0.25**2) ** 0.5)
    assert rows[0]["verdict"] == "noise"


def test_speedup_is_an_improvement_and_small_drift_is_noise():
    assert compare_reports(report(40.0, 0.4), report(30.0, 0.3))[0]["verdict"] == "improvement"
    assert verdict(1 + MIN_CHANGE / 2, noise=0.0) == "noise"
    assert verdict(1 - 2 * MIN_CHANGE, noise=0.0) == "improvement"


def test_a_first_schema_report_still_compares():
    old = {
        "schema": "tconform-bench/1",
        "results": [{**report(40.0, 0.4)["results"][0], "status": "ok"}],
    }
    assert compare_reports(old, report(44.0, 0.4))[0]["verdict"] == "regression"


def test_rows_missing_on_one_side_are_left_out():
    other = report(40.0, 0.4)
    other["results"][0]["case"] = "feed_forward"
    assert compare_reports(report(40.0, 0.4), other) == []
    with pytest.raises(UsageError, match="share no measured row"):  # nothing compared: no pass
        compare_table([])


def test_a_json_from_another_tool_is_a_usage_error(tmp_path):
    path = tmp_path / "verify.json"
    path.write_text(json.dumps({"tool": "tconform verify", "results": []}))
    with pytest.raises(UsageError, match="not a tconform bench report"):
        load_report(path)
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(UsageError, match="not a readable bench report"):
        load_report(broken)


@pytest.mark.parametrize(
    ("field", "value", "says"),
    [("p50_ms", 0, "p50_ms must be above 0"), ("p50_ms", None, "p50_ms must be a number"),
     ("std_ms", "zz", "std_ms must be a number"), ("mean_ms", float("nan"), "mean_ms"),
     ("runs", None, "runs must be a positive integer"), ("case", ["x"], "case must be a name"),
     ("batch", "1", "batch must be a positive integer")],
)  # fmt: skip
def test_a_measured_row_it_cannot_compare_is_named(tmp_path, field, value, says):
    data = report(40.0, 0.4)
    data["results"][0][field] = value
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=f"result 0: {says}"):
        load_report(path)


def test_compare_refuses_report_options_it_would_not_write(cli, tmp_path):
    path = tmp_path / "a.json"
    path.write_text(json.dumps(report(40.0, 0.4)))
    code, _, err = cli(
        "bench", "--compare", str(path), str(path), "--json", str(tmp_path / "c.json")
    )
    assert code == 2 and "--compare prints its table only" in err
    # Like every usage error's, the requested report holds the error and nothing else.
    written = json.loads((tmp_path / "c.json").read_text())
    assert written["exit_code"] == 2 and written["results"] == []
    assert "--compare prints its table only" in written["error"]["message"]

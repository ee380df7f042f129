"""`tconform bench --compare A.json B.json`: per-row latency ratio B/A with a noise estimate.

Noise rule: each side's relative standard error of the mean is (std / mean) / sqrt(runs); the
ratio's relative standard error is both combined in quadrature. A row is a regression when the
ratio exceeds 1 + max(3 * that error, MIN_CHANGE), an improvement when it is below
1 - max(3 * that error, MIN_CHANGE), and noise otherwise. MIN_CHANGE guards against runs so
steady that a 1% drift from machine load would be called a change.
"""

from __future__ import annotations

import math
from pathlib import Path

from tconform.bench.summary import shape_label
from tconform.errors import UsageError
from tconform.files import read_json_object
from tconform.report.text import format_table
from tconform.results import Status

# Reports this comparison reads: /1 called a measured row "ok", /2 to /4 call it "pass".
SCHEMAS = {
    "tconform-bench/1": "ok",
    "tconform-bench/2": Status.PASS.value,
    "tconform-bench/3": Status.PASS.value,
    "tconform-bench/4": Status.PASS.value,
    "tconform-bench/5": Status.PASS.value,
}
MIN_CHANGE = 0.03
SIGMAS = 3.0
KEY = ("case", "engine", "ep", "input_set", "batch", "seq")


def load_report(path: Path) -> dict:
    """A bench JSON, or a one-line UsageError for anything else."""
    data = read_json_object(Path(path), what="bench report")
    if data.get("schema") not in SCHEMAS:
        raise UsageError(f"{path}: not a tconform bench report (schema {', '.join(SCHEMAS)})")
    if not isinstance(data.get("results"), list):
        raise UsageError(f"{path}: a bench report without results")
    for n, row in enumerate(_measured(data)):
        problem = _row_problem(row)
        if problem:
            raise UsageError(f"{path}: result {n}: {problem}")
    return data


def _row_problem(row: dict) -> str:
    """What makes a measured row unusable for a comparison ('' when nothing does)."""
    for name in ("case", "engine", "ep"):
        if not isinstance(row.get(name), str):
            return f"{name} must be a name"
    for name in ("batch", "seq", "runs"):
        value = row.get(name)
        # a user's model's row names its input set; an axis its model lacks is null
        if value is None and name != "runs" and isinstance(row.get("input_set"), str):
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            return f"{name} must be a positive integer"
    for name in ("p50_ms", "mean_ms", "std_ms"):
        value = row.get(name)
        if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0:
            return f"{name} must be a number >= 0"
        if not math.isfinite(value):
            return f"{name} must be finite"
    if row["p50_ms"] == 0:
        return "p50_ms must be above 0"
    return ""


def _measured(report: dict) -> list[dict]:
    ok = SCHEMAS[report["schema"]]
    return [r for r in report["results"] if isinstance(r, dict) and r.get("status") == ok]


def relative_error(row: dict) -> float:
    """Relative standard error of the row's mean latency."""
    if row["runs"] < 2 or row["mean_ms"] <= 0:
        return math.inf
    return row["std_ms"] / row["mean_ms"] / math.sqrt(row["runs"])


def verdict(ratio: float, noise: float) -> str:
    threshold = max(SIGMAS * noise, MIN_CHANGE)
    if ratio > 1 + threshold:
        return "regression"
    if ratio < 1 - threshold:
        return "improvement"
    return "noise"


def compare_reports(before: dict, after: dict) -> list[dict]:
    """One entry per row measured in both reports, in `after`'s order."""
    old = {tuple(r.get(k) for k in KEY): r for r in _measured(before)}
    rows = []
    for new in _measured(after):
        key = tuple(new.get(k) for k in KEY)
        if key not in old:
            continue
        ratio = new["p50_ms"] / old[key]["p50_ms"]
        noise = math.hypot(relative_error(old[key]), relative_error(new))
        rows.append(
            {
                **dict(zip(KEY, key, strict=True)),
                "a_p50_ms": old[key]["p50_ms"],
                "b_p50_ms": new["p50_ms"],
                "ratio": ratio,
                "noise": noise,
                "verdict": verdict(ratio, noise),
            }
        )
    return rows


def compare_table(rows: list[dict]) -> str:
    if not rows:  # nothing compared is not a comparison
        raise UsageError("the two reports share no measured row (case, engine, ep, shape)")
    header = ("case", "engine", "ep", "shape", "A p50", "B p50", "B/A", "±noise", "verdict")
    cells = [
        (
            r["case"], r["engine"], r["ep"], shape_label(r), f"{r['a_p50_ms']:.4g}",
            f"{r['b_p50_ms']:.4g}", f"{r['ratio']:.3f}", f"{SIGMAS * r['noise']:.3f}",
            r["verdict"],
        )
        for r in rows
    ]  # fmt: skip
    return format_table(header, cells, right=[3, 4, 5, 6, 7])

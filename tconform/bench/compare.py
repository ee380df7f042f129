"""`tconform bench --compare A.json B.json`: per-row latency ratio B/A with a noise estimate.

Noise rule: each side's relative standard error of the mean is (std / mean) / sqrt(runs); the
ratio's relative standard error is both combined in quadrature. A row is a regression when the
ratio exceeds 1 + max(3 * that error, MIN_CHANGE), an improvement when it is below
1 - max(3 * that error, MIN_CHANGE), and noise otherwise. MIN_CHANGE guards against runs so
steady that a 1% drift from machine load would be called a change.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from tconform.bench.runner import SCHEMA
from tconform.errors import UsageError

MIN_CHANGE = 0.03
SIGMAS = 3.0
KEY = ("case", "engine", "ep", "batch", "seq")


def load_report(path: Path) -> dict:
    """A bench JSON, or a one-line UsageError for anything else."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable JSON file ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise UsageError(f"{path}: not a tconform bench report (expected schema {SCHEMA})")
    return data


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
    """One entry per row present (status ok) in both reports, in `after`'s order."""
    old = {tuple(r[k] for k in KEY): r for r in before["results"] if r.get("status") == "ok"}
    rows = []
    for new in after["results"]:
        key = tuple(new[k] for k in KEY)
        if new.get("status") != "ok" or key not in old:
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


def compare_lines(rows: list[dict]) -> list[str]:
    lines = [
        f"{'case':<14} {'engine':<22} {'ep':<4} {'BxS':>6} {'A p50':>9} {'B p50':>9} "
        f"{'B/A':>6} {'±noise':>7}  verdict"
    ]
    for r in rows:
        lines.append(
            f"{r['case']:<14} {r['engine']:<22} {r['ep']:<4} {r['batch']}x{r['seq']:<4} "
            f"{r['a_p50_ms']:>9.4g} {r['b_p50_ms']:>9.4g} {r['ratio']:>6.3f} "
            f"{SIGMAS * r['noise']:>7.3f}  {r['verdict']}"
        )
    return lines

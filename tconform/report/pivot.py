"""The pivot view of a matrix run: cases as rows, cells (and runtimes) as columns, each entry
the worst verdict over the input sets and the share of tolerance it used; in the terminal, in
markdown and as a PNG heat map. An entry that could not run says `n.a.`, and why, below."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tconform.report.png import save
from tconform.report.table import render as render_table
from tconform.report.text import format_table
from tconform.results import Result
from tconform.runtimes.labels import runtime_label
from tconform.units import MODULE

# Worse verdicts win an entry; among equal ones, the larger share of tolerance used.
_RANK = {"pass": 0, "skip": 1, "unavailable": 2, "fail": 3, "error": 4, "crash": 5}
_SHOWN = {
    "skip": "n.a.",
    "unavailable": "unavail.",
    "fail": "FAIL",
    "error": "ERROR",
    "crash": "CRASH",
}


@dataclass
class Pivot:
    cases: list[str]
    columns: list[str]
    entries: dict[tuple[str, str], Result]  # (case, column) -> the worst result

    def text(self, case: str, column: str) -> str:
        r = self.entries.get((case, column))
        if r is None:
            return ""
        used = "" if r.worst_used is None else f" {r.worst_used:.0%}"
        if r.status == "pass":
            return "pass" + used
        return _SHOWN[r.status] + (used if r.status == "fail" else "")

    def reasons(self) -> list[str]:
        """Why each entry that is not a pass is what it is, once per column and reason."""
        return list(
            dict.fromkeys(
                f"{column}: {r.message}"
                for (_, column), r in self.entries.items()
                if r.status != "pass" and r.message
            )
        )


def column(r: Result) -> str:
    runtime = runtime_label(r.runtime, r.ep, r.precision)
    return runtime if r.cell in ("", MODULE) else f"{r.cell} {runtime}"


def build(results: list[Result]) -> Pivot:
    measured = [r for r in results if not r.case.startswith("doc:")]
    entries: dict[tuple[str, str], Result] = {}
    for r in measured:
        key = (r.case, column(r))
        old = entries.get(key)
        if (
            old is None
            or _RANK[r.status] > _RANK[old.status]
            or (r.status == old.status and (r.worst_used or 0) > (old.worst_used or 0))
        ):
            entries[key] = r
    # A fixed order, so that a merged report of shards shows what the full run shows: cases by
    # name, export cells by their key, the PyTorch module's columns last.
    cases = sorted({r.case for r in measured})
    order = {column(r): (r.cell in ("", MODULE), column(r)) for r in measured}
    columns = sorted(order, key=order.__getitem__)
    return Pivot(cases, columns, entries)


def render(results: list[Result]) -> str:
    pivot = build(results)
    rows = [[case, *(pivot.text(case, c) for c in pivot.columns)] for case in pivot.cases]
    # Columns are numbered, their names listed below: cell names are too long for a header.
    header = ["case", *(f"[{n}]" for n in range(1, len(pivot.columns) + 1))]
    lines = [format_table(header, rows), "", "columns:"]
    lines += [f"  [{n}] {c}" for n, c in enumerate(pivot.columns, 1)]
    reasons = pivot.reasons()
    if reasons:
        lines += ["", "not passed, why:", *(f"  {line}" for line in reasons)]
    return "\n".join(lines)


def render_with_pivot(results: list[Result]) -> str:
    """The terminal output of a matrix run: the full table, then the pivot."""
    return (
        render_table(results)
        + "\n\nmatrix (worst over input sets, share of tolerance):\n"
        + (render(results))
    )


def markdown(results: list[Result]) -> str:
    pivot = build(results)
    lines = [
        "| case | " + " | ".join(pivot.columns) + " |",
        "|---|" + "---|" * len(pivot.columns),
    ]
    for case in pivot.cases:
        lines.append(f"| {case} | " + " | ".join(pivot.text(case, c) for c in pivot.columns) + " |")
    reasons = pivot.reasons()
    if reasons:
        lines += ["", *(f"- {line}" for line in reasons)]
    return "\n".join(lines) + "\n"


def write_heatmap(path: Path, results: list[Result]) -> None:
    """A PNG: green well inside tolerance, yellow at it, red beyond; grey where n.a."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    pivot = build(results)
    values = np.full((len(pivot.cases), len(pivot.columns)), np.nan)
    for (case, col), r in pivot.entries.items():
        if r.status in ("pass", "fail"):
            values[pivot.cases.index(case), pivot.columns.index(col)] = min(r.worst_used or 0, 2)
        elif r.status in ("error", "crash"):
            values[pivot.cases.index(case), pivot.columns.index(col)] = 2.0
    colours = matplotlib.colormaps["RdYlGn_r"].with_extremes(bad="lightgrey")
    width = max(6.0, 0.9 * len(pivot.columns) + 3)
    fig, ax = plt.subplots(figsize=(width, 0.45 * len(pivot.cases) + 3))
    image = ax.imshow(np.ma.masked_invalid(values), cmap=colours, vmin=0, vmax=2, aspect="auto")
    for i, case in enumerate(pivot.cases):
        for j, col in enumerate(pivot.columns):
            ax.text(j, i, pivot.text(case, col), ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(pivot.columns)), pivot.columns, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(pivot.cases)), pivot.cases, fontsize=8)
    fig.colorbar(image, ax=ax, label="share of tolerance used (capped at 2)")
    ax.set_title("tconform verify --matrix: worst over input sets (grey: n.a.)")
    fig.tight_layout()
    save(fig, path, dpi=110, bbox_inches="tight")  # keeps the colour-bar label

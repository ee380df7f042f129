"""A markdown summary for CI job pages: one row per case and runtime (its worst input set, named),
the input sets checked, and every result that did not pass."""

from __future__ import annotations

import itertools
from pathlib import Path

from tconform.errors import one_line
from tconform.files import atomic_write_text
from tconform.report import RunReport, pivot
from tconform.results import Result
from tconform.runtimes.labels import runtime_label

HEADER = (
    "| case | runtime | precision | providers used | worst input set | worst tol used | status "
    "| model |"
)
_RANK = {"pass": 0, "tie": 1, "skip": 1, "unavailable": 2, "fail": 3, "error": 4, "crash": 5}


def build(report: RunReport) -> str:
    matrix = bool(report.settings.get("matrix"))
    worst: dict[tuple[str, str], Result] = {}
    for r in report.results:
        key = (r.case, _where(r, matrix))
        if (
            key not in worst
            or _RANK[r.status] > _RANK[worst[key].status]
            or (
                r.status == worst[key].status and (r.worst_used or 0) > (worst[key].worst_used or 0)
            )
        ):
            worst[key] = r
    lines = []
    if report.error is not None:
        lines += [
            f"**The run stopped early (exit {report.error['exit_code']}):** "
            f"{_md(str(report.error['message']))}",
            "",
        ]
    lines += [HEADER, "|---|---|---|---|---|---|---|---|"]
    for (case, runtime), r in worst.items():
        used = "-" if r.worst_used is None else f"{r.worst_used:.1%}"
        model = f"{r.model.origin} `{_md(r.model.path)}` {r.model.sha256[:12]}" if r.model else "-"
        lines.append(
            f"| {_md(case)} | {runtime} | {r.precision} | {', '.join(r.ep_actual) or '-'} "
            f"| {_md(r.input_set) or '-'} | {used} | {r.status} | {model} |"
        )
    sets = dict.fromkeys(r.input_set for r in report.results if r.input_set)
    if sets:
        lines += ["", f"Input sets: {', '.join(sets)}."]
    lines += _not_passed(report.results, matrix)
    # A result judged against anything but the float64 reference says so (tconform check's
    # float32 fallback).
    weaker = dict.fromkeys(
        f"{r.case} ({r.runtime}): reference {r.reference}"
        for r in report.results
        if r.reference != "float64"
    )
    if weaker:
        lines += ["", *(f"- {line}" for line in weaker)]
    if matrix:
        lines += ["", "### Matrix: worst over input sets, share of tolerance used", ""]
        lines.append(pivot.markdown(report.results))
    lines += _localisations(report.details.get("localisation") or [])
    workers = report.worker_runtimes()
    if workers:
        lines += ["", "### Runtimes in a worker", ""] + [f"- {line}" for line in workers.values()]
    versions = report.versions_text()
    partings = [p["verdict"] for p in report.details.get("version_partings") or []]
    if versions or partings:
        lines += ["", "### Versions of a runtime", ""]
        lines += [f"- where they part: {_md(verdict)}" for verdict in partings]
        lines += ["", "```", versions, "```"] if versions else []
    return "\n".join(lines) + "\n"


def _md(text: str) -> str:
    """A name or message as markdown text on its line: control characters escaped (a newline
    would start a row of its own, an escape sequence recolour a terminal that shows the file)
    and `|` escaped (it would split a table's cell), and `<` and `>` (a name such as
    `</details>` from a merged report would be markup where markdown renders HTML)."""
    return one_line(text).replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;")


def _where(r: Result, matrix: bool) -> str:
    """A matrix run's cells stay apart; a plain run has one cell, named in its settings."""
    return pivot.column(r) if matrix else runtime_label(r.runtime, r.ep, r.precision)


def _not_passed(results: list[Result], matrix: bool) -> list[str]:
    """Every result that neither passed nor tied, with its input set and why: the table keeps
    one per case and runtime, and a failing set (batch consistency, say) must not hide there."""
    lines = [
        _md(
            f"- {r.case}, {_where(r, matrix)}, {r.input_set or '-'}: {r.status}: "
            f"{r.message.splitlines()[0] if r.message else ''}"
        )
        for r in results
        if r.status not in ("pass", "tie")
    ]
    return ["", "### Not passed", "", *lines] if lines else []


def _localisations(found: list[dict]) -> list[str]:
    """Where an error starts (verify/check --localise): each provider's verdict, then the
    module boundaries outside tolerance in execution order (the JSON has every boundary)."""
    lines = []
    for loc in found:
        lines += ["", f"### Localisation on {_md(loc['runtime'])}", "", _md(loc["verdict"]), ""]
        failing = [b for b in loc["boundaries"] if b["status"] == "fail"]
        if failing:
            lines += ["| module | class | max abs err | tol used |", "|---|---|---|---|"]
        for b in failing:
            judged = [o for o in b["outputs"] if o.get("tolerance_used") is not None]
            worst = max(judged, key=lambda o: o["tolerance_used"], default=None)
            figures = (
                f"{worst['max_abs_err']:.2e} | {worst['tolerance_used']:.3g}x" if worst else "- | -"
            )
            name = _md(b.get("path") or "(whole module)")
            lines.append(f"| `{name}` | {b['cls'].rsplit('.', 1)[-1]} | {figures} |")
    return lines


def is_own(path: Path) -> bool:
    """Whether `path` holds a markdown summary tconform wrote (so replacing it loses nothing)."""
    try:
        with path.open(encoding="utf-8") as text:
            return any(line.rstrip("\n") == HEADER for line in itertools.islice(text, 8))
    except (OSError, UnicodeDecodeError):
        return False


def write(path: Path, report: RunReport) -> None:
    atomic_write_text(path, build(report))

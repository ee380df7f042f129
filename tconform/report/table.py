"""The terminal table: one row per case, runtime and input set."""

from __future__ import annotations

from tconform.errors import one_line
from tconform.report.text import format_table
from tconform.results import Result, nothing_checked
from tconform.runtimes.labels import runtime_label

COLUMNS = (
    "case",
    "runtime",
    "input set",
    "max abs err",
    "max rel err",
    "tol used",
    "status",
    "nodes per provider",
    "model",
)


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.2e}"


def _row(r: Result) -> tuple[str, ...]:
    errs = [o.max_abs_err for o in r.outputs if o.max_abs_err is not None]
    rels = [o.max_rel_err for o in r.outputs if o.max_rel_err is not None]
    runtime = runtime_label(r.runtime, r.ep, r.precision)
    used = r.worst_used
    # a non-finite value where the golden differs (float32 overflow): its error is unbounded,
    # whatever the finite elements' figures say
    unbounded = any(o.kind == "nonfinite" for o in r.outputs)
    return (
        r.case,
        runtime,
        r.input_set.replace("test_data_set_", "set "),
        "inf" if unbounded else _num(max(errs) if errs else None),
        _num(max(rels) if rels else None),
        "inf" if unbounded else "-" if used is None else f"{used:.1%}",
        r.status.upper() if r.status != "pass" else "pass",
        ", ".join(f"{ep} {n}" for ep, n in r.placement.items()) or "-",
        f"{r.model.origin} {r.model.sha256[:SHA_SHOWN]}" if r.model else "-",
    )


SHA_SHOWN = 12  # hex digits of a model's sha256 in the table; the legend and JSON have all


def model_legend(results: list[Result]) -> list[str]:
    """One line per distinct model that ran: its short hash, origin, path and what it says of
    itself, so every row's model column resolves to exact bytes."""
    seen = {r.model.sha256 + r.model.path: r.model for r in results if r.model}
    lines = []
    for model in seen.values():
        about = ", ".join(
            part
            for part in (
                model.producer,
                ("opsets " + ", ".join(f"{d} {v}" for d, v in model.opsets.items()))
                if model.opsets
                else "",
                model.elem_type,
                f"{model.compute_elem_type} inside"
                if model.compute_elem_type not in ("", model.elem_type)
                else "",
            )
            if part
        )
        lines.append(
            one_line(
                f"  {model.sha256[:SHA_SHOWN]}  {model.origin:8s} {model.path}"
                + (f"  ({about})" if about else "")
            )
        )
    return lines


def _cells_tell_rows_apart(results: list[Result]) -> bool:
    """Whether rows of one case, runtime and input set differ only by their cell."""
    cells: dict[tuple, set[str]] = {}
    for r in results:
        cells.setdefault((r.case, r.runtime, r.ep, r.precision, r.input_set), set()).add(r.cell)
    return any(len(found) > 1 for found in cells.values())


def render(results: list[Result]) -> str:
    rows = [_row(r) for r in results]
    columns = COLUMNS
    cells = _cells_tell_rows_apart(results)
    if cells:  # a matrix, or cache/no-cache: say which row is which
        columns = (*COLUMNS[:2], "cell", *COLUMNS[2:])
        rows = [(*row[:2], r.cell or "-", *row[2:]) for row, r in zip(rows, results, strict=True)]
    lines = format_table(columns, rows).splitlines()

    def where(r: Result) -> str:  # and its cell, where the table tells cells apart
        return f"{r.runtime}/{r.ep}{f' {r.cell}' if cells and r.cell else ''} {r.input_set}"

    problems = [  # each failing result's message, then its outputs' worst elements under it
        line
        for r in results
        if r.status != "pass" and r.message
        for line in (
            one_line(f"  {r.case} [{where(r)}]: {r.message}"),
            *(
                f"      {o.name} worst: {_worst(w, o.atol, o.rtol)}"
                for o in r.outputs
                if o.status == "fail"
                for w in o.worst[:3]
            ),
        )
    ]
    facts = dict.fromkeys(  # once per case and runtime, not per input set
        one_line(f"  {r.case} [{r.runtime}/{r.ep}]: {note}") for r in results for note in r.notes
    )
    problems = ["", "problems:", *problems] if problems else []
    legend = model_legend(results)
    models = ["", "models (sha256, origin, path):", *legend] if legend else []
    return "\n".join(lines + models + (["", "notes:", *facts] if facts else []) + problems)


def _worst(element: dict[str, object], atol: float, rtol: float) -> str:
    """One of an output's worst elements, those that used most of their tolerance (which need
    not hold the largest |err| its message names): `at [0, 6, 62]: -0.575 for -0.619 (|err|
    0.0445, 3.1x its tolerance)` (a non-finite value as JSON holds it)."""

    def number(x: object) -> str:
        return f"{x:.4g}" if isinstance(x, float) else str(x)

    err, golden = element.get("abs_err"), element.get("golden")
    share = ""
    if isinstance(err, float) and isinstance(golden, float):
        allowed = atol + rtol * abs(golden)
        share = f", {err / allowed:.3g}x its tolerance" if allowed > 0 else ""
    return (
        f"at {element.get('index')}: {number(element.get('actual'))} for "
        f"{number(golden)} (|err| {number(err)}{share})"
    )


def summary(results: list[Result]) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.status] = counts.get(r.status, 0) + 1
    parts = [f"{n} {status}" for status, n in sorted(counts.items())]
    line = f"{len(results)} results: " + ", ".join(parts)
    if nothing_checked(r.status for r in results):
        line += " (nothing was checked: not a pass)"
    return line

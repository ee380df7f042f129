"""Localisation for people: the verdict line and the table of boundaries (the terminal and the
markdown report show the same text)."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING

from tconform.localise.judge import Boundary, inside

if TYPE_CHECKING:  # the result type, for hints only (it lives above this module)
    from tconform.localise import Localisation


def _ops(ops: dict[str, int]) -> str:
    return ", ".join(f"{op} x{n}" for op, n in sorted(ops.items(), key=lambda i: -i[1])) or "none"


def _share(used: float | None) -> str:
    if used is None:
        return "-"
    return f"{used:.1%}" if used < 10 else f"{used:.0f}x"


def _isolated_line(first: Boundary) -> str:
    if first.isolated is None:
        return ""
    worst = max(first.isolated, key=lambda c: c.tolerance_used or 0.0, default=None)
    if worst is None:
        return ""
    figures = f"max abs err {worst.max_abs_err:.3g}, {_share(worst.tolerance_used)} of tolerance"
    if first.isolated_status == "fail":
        return f"; isolated on the reference's inputs it fails too ({figures}): it computes wrong"
    return (
        f"; isolated on the reference's inputs it passes ({figures}): it amplifies the error it "
        "inherited within tolerance"
    )


def verdict(boundaries: list[Boundary], first: Boundary | None) -> str:
    root = next((b for b in boundaries if b.path == ""), None)
    failing = [b for b in boundaries if b.status == "fail"]
    if root is not None and root.status != "fail":
        absorbed = [b.label for b in failing]
        if absorbed:
            return (
                "no divergence: the outputs are within tolerance; inside, "
                f"{', '.join(absorbed)} left it (absorbed before the outputs)"
            )
        return "no divergence: every matched module boundary is within tolerance"
    if first is None:
        if failing:
            return (
                "every module outside tolerance already had an input outside it (or one that "
                f"could not be matched); the earliest is {failing[0].label}"
            )
        return "the outputs leave tolerance, but no module boundary could be matched"
    worst = first.worst
    assert worst is not None
    where = f"{first.label} ({first.cls})"
    figures = (
        f"max abs err {worst.max_abs_err:.3g} at {worst.max_abs_index}, max rel err "
        f"{worst.max_rel_err:.3g}, {worst.mismatches} elements outside tolerance, "
        f"{_share(worst.tolerance_used)} of the tolerance used"
    )
    inputs = {
        "pass": f"its inputs were within tolerance ({_share(first.worst_input_used)} used)",
        "none": "it has no floating-point inputs",
        "given": "its inputs are the model's inputs",
    }[first.inputs_status]
    fused = (
        f"; the exporter fused {first.fused_from} into its nodes, so the two are one unit"
        if first.fused_from
        else ""
    )
    inner = [
        b
        for b in boundaries
        if b.status not in ("unmatched", "fused") and inside(b.path, first.path)
    ]
    hidden = [b.label for b in boundaries if inside(b.path, first.path) and b.status == "unmatched"]
    own = ""
    if not any(b.status == "fail" and b.inputs_status != "fail" for b in inner):
        own = (
            "; none of its submodules diverged, so the error starts in its own ops "
            f"({_ops(first.own_ops)})"
        )
        if hidden:
            own += f" or in a submodule whose boundary could not be matched ({', '.join(hidden)})"
    return (
        f"first divergence: {where}: {figures}; {inputs}; ONNX ops inside: {_ops(first.ops)}"
        f"{fused}{own}{_isolated_line(first)}"
    )


# How the table marks a boundary's inputs: within tolerance, outside it, no float inputs, not
# all matched, or the model's own inputs.
_INPUT_MARKS = {"pass": "ok", "fail": "OUT", "none": "-", "unjudged": "?", "given": "in"}


def render(loc: Localisation) -> str:
    """The localisation report for the terminal (and the markdown report, in a code block)."""
    model = loc.model.path if loc.model else "the model"
    lines = [
        f"localisation on {loc.runtime}: {len(loc.boundaries)} module calls, "
        f"{len(loc.matched)} matched to ONNX tensors (scopes from {loc.scope_source}); "
        f"a temporary copy of {model} returned {loc.extra_outputs} boundary tensors in "
        f"{loc.fetch_runs} run(s); atol {loc.atol:g}, rtol {loc.rtol:g}",
    ]
    header = ("module", "class", "max abs err", "tol used", "isolated", "inputs", "status")
    rows = [header]
    for b in loc.boundaries:
        worst = b.worst
        isolated = "-"
        if b.isolated is not None:
            best = max(b.isolated, key=lambda c: c.tolerance_used or 0.0, default=None)
            isolated = _share(best.tolerance_used if best else None)
        rows.append(
            (
                b.label,
                b.cls.rsplit(".", 1)[-1],
                "-" if worst is None else f"{worst.max_abs_err:.2e}",
                _share(worst.tolerance_used if worst else None),
                isolated,
                "-" if b.status in ("unmatched", "fused") else _INPUT_MARKS[b.inputs_status],
                b.status.upper() if b.status == "fail" else b.status,
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for n, row in enumerate(rows):
        text = "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        if n > 0 and loc.first is loc.boundaries[n - 1]:
            text += "  <- first divergence"
        lines.append("  " + text)
        if n == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    unmatched = [b for b in loc.boundaries if b.status in ("unmatched", "fused")]
    if unmatched:
        lines.append("  not compared on their own:")
        reasons: dict[str, list[str]] = defaultdict(list)
        for b in unmatched:
            reasons[b.reason or "no ONNX tensor matched"].append(b.label)
        for why, labels in reasons.items():
            lines.append(f"    {', '.join(labels)}: {why}")
    lines.append(loc.verdict)
    if loc.repro:
        lines.append(f"repro bundle: {loc.repro} (python {loc.repro}/reproduce.py)")
    return "\n".join(lines)

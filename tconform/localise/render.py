"""Localisation for people: the verdict line and the table of boundaries (the terminal and the
markdown report show the same text)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING

from tconform.errors import one_line
from tconform.localise.isolate import MAX_ISOLATED
from tconform.localise.judge import Boundary, inside, share_used, worst_of

if TYPE_CHECKING:  # the result type, for hints only (it lives above this module)
    from tconform.localise import Localisation


def _ops(ops: dict[str, int]) -> str:
    return ", ".join(f"{op} x{n}" for op, n in sorted(ops.items(), key=lambda i: -i[1])) or "none"


def _share(used: float | None) -> str:
    if used is None:
        return "-"
    if math.isinf(used):
        return "inf"
    return f"{used:.1%}" if used < 10 else f"{used:.0f}x"


def _unfigured(comparisons: list) -> str:
    """The failures of `comparisons` that have no figures (a shape or a dtype that differs),
    in their own words: the figures of the others do not show them."""
    return "; ".join(c.message for c in comparisons if c.status == "fail" and c.max_abs_err is None)


def _figures(comparisons: list) -> str:
    """A failure without figures (a shape that differs) in its own words, else the worst of
    `comparisons` in figures."""
    worst = worst_of(comparisons)
    if _unfigured(comparisons) or worst is None:
        return _unfigured(comparisons) or "no figures"
    return f"max abs err {worst.max_abs_err:.3g}, {_share(share_used(worst))} of the tolerance"


# Why a module's isolated failure is more than rounding, once its nodes are evaluated plainly.
_FINDINGS = {
    "function": "its nodes compute another function than the module (evaluated in float64 on "
    "the reference's exact inputs: {exact} of the tolerance plus 2^-20 of the output's scale)",
    "runtime": "the runtime computes its nodes worse than a plain evaluation in the model's own "
    "types does ({plain} of the tolerance)",
    "unchecked": "not cross-checked by a plain evaluation of its nodes ({why})",
}


def _named(loc: Localisation, first: Boundary) -> str:
    """The named module: where the run shows the error, and the isolated run that proves it."""
    cumulative = first.worst
    changed = loc.observer is not None and loc.observer.changed
    where = "the run with the boundaries as outputs" if changed else "the run"
    figures = (
        "not matched in the run"
        if cumulative is None
        else (
            f"in {where} max abs err {cumulative.max_abs_err:.3g} at "
            f"{cumulative.max_abs_index}, max rel err {cumulative.max_rel_err:.3g}, "
            f"{cumulative.mismatches} elements outside tolerance, "
            f"{_share(share_used(cumulative))} of the tolerance used"
        )
    )
    if _unfigured(first.outputs):
        figures = f"in {where} {_unfigured(first.outputs)}" + (
            f" (the outputs compared in figures: {figures.removeprefix(f'in {where} ')})"
            if cumulative is not None
            else ""
        )
    inputs = {
        "pass": f"its inputs were within tolerance ({_share(first.worst_input_used)} used)",
        "fail": "its inputs were already outside tolerance",
        "none": "it has no floating-point inputs",
        "given": "its inputs are the model's inputs",
        "unjudged": "not all its inputs could be matched",
    }[first.inputs_status]
    fused = (
        f"; the exporter fused {first.fused_from} into its nodes, so the two are one unit"
        if first.fused_from
        else ""
    )
    finding = _FINDINGS[first.finding].format(
        exact=_share(first.exact_used), plain=_share(first.plain_used), why=first.unchecked
    )
    return (
        f"first divergence: {first.label} ({first.cls}): {figures}; {inputs}; ONNX ops inside: "
        f"{_ops(first.ops)}{fused}{_own_ops(loc, first)}; isolated on the reference's inputs it "
        f"fails too ({_figures(first.isolated or [])}): it computes wrong: {finding}"
    )


def _own_ops(loc: Localisation, first: Boundary) -> str:
    """Where inside the named module the error lies, as far as its submodules tell."""
    inner = [b for b in loc.boundaries if inside(b.path, first.path)]
    hidden = [b.label for b in inner if b.status == "unmatched" or b.not_isolated]
    cut = [b for b in inner if b.isolated]
    if not inner:
        return ""
    own = "; none of its submodules fails on its own"
    if cut:
        largest = max(cut, key=lambda b: share_used(worst_of(b.isolated)))
        used = _share(share_used(worst_of(largest.isolated)))
        own += f" (the largest own error inside it: {largest.label}, {used})"
    own += f", so the error starts in its own ops ({_ops(first.own_ops)})"
    if cut:
        own += " or grows from errors within tolerance of the submodules it composes"
    if hidden:
        own += f" or in a submodule that could not be isolated ({', '.join(hidden)})"
    return own


def _some(items: list[str], most: int = 5) -> str:
    more = f" and {len(items) - most} more" if len(items) > most else ""
    return ", ".join(items[:most]) + more


def _unnamed(loc: Localisation) -> str:
    """Why no module is named although the outputs leave tolerance."""
    parts = []
    if loc.isolate_modules == "none":
        parts.append("nothing is cut out and isolated (--isolate none)")
    cut = [b for b in loc.boundaries if b.isolated is not None]
    rounding = [b.label for b in cut if b.finding == "rounding"]
    if rounding:
        parts.append(
            f"{_some(rounding)} leave tolerance isolated only as far as a plain evaluation of "
            "their nodes in the model's own types does: the tolerance is tighter than that "
            "precision's rounding there"
        )
    unproven = [f"{b.label} ({b.unchecked})" for b in cut if b.finding == "unproven"]
    if unproven:
        parts.append(
            f"{_some(unproven)} leave tolerance isolated, but no plain evaluation of their nodes "
            "could check it, and they are within their precision's own row: the tolerance is "
            "tighter than that row, so rounding is not ruled out"
        )
    passing = [b for b in cut if b.isolated_status == "pass"]
    if loc.path is not None and loc.path in passing:
        used = _share(share_used(worst_of(loc.path.isolated or [])))
        parts.append(
            f"{loc.path.label}, the first boundary outside tolerance on inputs within it, passes "
            f"isolated ({used}): it amplifies an error it inherited within tolerance"
        )
    elif passing:
        parts.append(f"{len(passing)} module(s) cut out pass isolated ({passing[0].label} first)")
    blocked = [f"{b.label} ({b.not_isolated})" for b in loc.boundaries if b.not_isolated]
    if blocked:
        parts.append(f"not isolated: {_some(blocked)}")
    if loc.not_reached:
        parts.append(
            f"{loc.not_reached} more candidate(s) were not cut out (at most {MAX_ISOLATED} are, "
            "along the path)"
        )
    if not parts:
        parts.append("no module boundary could be matched")
    return "no module is named: " + "; ".join(parts)


def _inside(loc: Localisation) -> str:
    """The module boundaries outside tolerance in a run whose outputs do not name one. Under a
    padding mask, a boundary whose tensors do not lead with the mask's (batch, sequence) (a
    flattened batch x sequence, say) was compared at every position: said so, since padded
    rows may be all that differs there."""
    failing = [b for b in loc.boundaries if b.status == "fail" and b.path]
    where = "at the real positions" if loc.masked else ""
    if not failing:
        return " ".join(filter(None, [where, "every matched module boundary is within tolerance"]))
    everywhere = [b for b in failing if loc.masked and _unmasked(b)]
    real = [b for b in failing if b not in everywhere]
    said = [f"{', '.join(b.label for b in real)} left it {where}".rstrip()] if real else []
    if everywhere:
        said.append(
            f"{', '.join(b.label for b in everywhere)} left it compared at every position, "
            "padded ones included, since their tensors do not lead with the mask's batch and "
            "sequence"
        )
    return f"inside, {'; '.join(said)} (absorbed before the outputs)"


def _unmasked(b: Boundary) -> bool:
    """Whether none of `b`'s outputs outside tolerance left a padded position out."""
    return all(o.excluded == 0 for o in b.outputs if o.status == "fail")


def verdict(loc: Localisation) -> str:
    """One paragraph: what is named and the numbers that prove it, or why nothing is."""
    root = next((b for b in loc.boundaries if b.path == ""), None)
    inside_note = _inside(loc)
    preface = ""
    if loc.foreign:
        preface = (
            f"the file's nodes are mostly scoped to modules this module does not have "
            f"({_some(loc.foreign)}): is it an export of this module? "
        )
    if loc.observer is not None and loc.observer.changed:
        preface += (
            f"observing changed the run: {loc.observer.describe()}; its boundary values are not "
            "the judged run's, so a module is named by isolation alone. "
        )
    if loc.padding_only and not loc.real_positions:  # --padding-mask left them out already
        return (
            "no divergence at the real positions: the outputs differ only where the padding "
            f"mask is 0, which --padding-mask leaves out (no framework defines them); {inside_note}"
        )
    if loc.padding_only:
        mask = loc.real_positions
        advice = f"; compare those only with --padding-mask {mask}"
        return (
            f"no module is named: the outputs leave tolerance only where {mask} is 0 (padding, "
            f"whose outputs no framework defines); {inside_note}{advice}"
        )
    if (root is None or root.status != "fail") and loc.first is not None:
        return (
            f"{preface}the outputs are within tolerance, yet a module inside computes another "
            f"function, absorbed before the outputs on these inputs (the verdict is the "
            f"outputs'): {_named(loc, loc.first)}"
        )
    if root is None or root.status != "fail":
        failing = any(b.status == "fail" and b.path for b in loc.boundaries)
        what = "the outputs are within tolerance; " + inside_note if failing else inside_note
        return f"{preface}no divergence: {what}"
    return preface + (_named(loc, loc.first) if loc.first is not None else _unnamed(loc))


# How the table marks a boundary's inputs: within tolerance, outside it, no float inputs, not
# all matched, or the model's own inputs.
_INPUT_MARKS = {"pass": "ok", "fail": "OUT", "none": "-", "unjudged": "?", "given": "in"}


def _status(b: Boundary, run_fails: bool) -> str:
    """FAIL for a boundary outside tolerance in a failing run; in a run whose outputs pass, such a
    boundary left tolerance and was absorbed before the outputs: `outside`, which the verdict
    lists (a tolerance tighter than an intermediate value's rounding)."""
    if b.status != "fail":
        return b.status
    return "FAIL" if run_fails else "outside"


_SCALED = " (scaled down for tensors of smaller RMS than the row's)"


def render(loc: Localisation) -> str:
    """The localisation report for the terminal (and the markdown report, in a code block)."""
    model = one_line(loc.model.path) if loc.model else "the model"  # a name, on its line
    lines = [
        f"localisation on {loc.runtime}: {len(loc.boundaries)} module calls, "
        f"{len(loc.matched)} matched to ONNX tensors (scopes from {loc.scope_source}); "
        f"a temporary copy of {model} returned {loc.extra_outputs} boundary tensors in "
        f"{loc.fetch_runs} run(s); atol {loc.atol:g}{_SCALED if loc.atol_scaled else ''}, "
        f"rtol {loc.rtol:g}",
    ]
    if loc.observer is not None:
        lines.append(f"observer check: {loc.observer.describe()}")
    if loc.real_positions:
        lines.append(
            f"compared at the real positions of {loc.real_positions} only (where it is 1): "
            "padded positions' outputs are whatever a framework computes there"
        )
    run_fails = any(b.path == "" and b.status == "fail" for b in loc.boundaries)
    header = ("module", "class", "max abs err", "tol used", "isolated", "inputs", "status")
    rows = [header]
    for b in loc.boundaries:
        worst = b.worst
        isolated = "-"
        if b.isolated is not None:
            own = worst_of(b.isolated)
            isolated = " ".join(filter(None, [_share(own and share_used(own)), b.finding]))
        rows.append(
            (
                b.label,
                b.cls.rsplit(".", 1)[-1],
                "-" if worst is None else f"{worst.max_abs_err:.2e}",
                _share(worst and share_used(worst)),
                isolated,
                "-" if b.status in ("unmatched", "fused") else _INPUT_MARKS[b.inputs_status],
                _status(b, run_fails),
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

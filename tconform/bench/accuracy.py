"""Each bench row's outputs judged against the float64 oracle, under the tolerance row of the
precision the engine computes in (the int8 rows for ONNX Runtime's int8 graph and torch's
dynamic int8 module alike, so both face one tolerance): whether they pass, the largest
absolute error and the SQNR. A fast engine that computes something else is no result."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import numpy as np

from tconform.compare import OutputComparison, compare_output, tolerance_for
from tconform.errors import EXIT_EP_UNAVAILABLE, EXIT_FAILURE, TconformError, UsageError
from tconform.results import Status


def judge_outputs(
    outputs: Mapping[str, np.ndarray],
    golden: Mapping[str, np.ndarray],
    precision: str,
    tolerance_class: str,
    preset: str | None = None,
    judge: Callable[[Mapping[str, np.ndarray], str], list[OutputComparison]] | None = None,
) -> dict[str, object]:
    """The accuracy block of a row: every golden output compared under the row
    (`precision`, `tolerance_class`) of tconform.compare.TOLERANCES (the `preset`'s own where it
    has one: PRESET_TOLERANCES), or for a user's model by `judge` (outputs, precision), the
    one check judges it with (each output's own tolerance, its padding mask); the worst error
    and the lowest SQNR over the outputs, and each output's own."""
    judged: dict[str, object] = {"precision": precision, "tolerance": tolerance_class}
    try:
        row = tolerance_for(precision, tolerance_class, preset)
        if judge is not None:
            comparisons = judge(outputs, precision)
        else:
            comparisons = [
                compare_output(name, np.asarray(outputs[name]), expected, row)
                for name, expected in golden.items()
            ]
    except UsageError as exc:
        return {**judged, "status": Status.SKIP.value, "reason": str(exc)}
    sqnrs = [c.sqnr_db for c in comparisons if c.sqnr_db is not None]
    if all(c.status == Status.PASS for c in comparisons):
        # a pass that shows nothing (no finite element, a tolerance blind to the values) is
        # never a pass, as in every command (execution.settle)
        unseen = [f"{c.name}: {c.unseen()}" for c in comparisons if c.unseen()]
        status = Status.SKIP if len(unseen) == len(comparisons) else Status.PASS
        if status == Status.SKIP:
            judged["reason"] = "nothing compared: " + "; ".join(unseen)
    else:
        status = Status.FAIL
    return {
        **judged,
        "atol": row.atol,
        "rtol": row.rtol,
        "min_sqnr_db": row.min_sqnr_db,
        "status": status.value,
        "max_abs_err": max((c.max_abs_err or 0.0 for c in comparisons), default=0.0),
        # None: no output had any error at all (an infinite ratio)
        "sqnr_db": min(sqnrs) if sqnrs else None,
        "outputs": {c.name: _output(c) for c in comparisons},
    }


def _output(comparison: OutputComparison) -> dict[str, object]:
    return {
        "status": comparison.status,
        "atol": comparison.atol,  # the row's, scaled to the output's RMS where it is small
        "max_abs_err": comparison.max_abs_err,
        "sqnr_db": comparison.sqnr_db,
        **({"message": comparison.message} if comparison.message else {}),
    }


def require_within_tolerance(rows: Iterable[Mapping[str, object]]) -> None:
    """Exit 1 (its reports are written first, as for every failure) where a timed row's
    outputs left their tolerance row: a bench that timed a wrong answer did not pass. Exit 3
    where rows were judged and none compared anything (every output empty, NaN or infinite):
    nothing checked is never a pass."""
    rows = list(rows)
    judged = [row for row in rows if _judged_status(row) is not None]
    if judged and all(_judged_status(row) == Status.SKIP for row in judged):
        reason = judged[0]["accuracy"].get("reason", "")
        raise TconformError.with_code(
            f"nothing checked: no timed row's outputs could be compared ({reason})",
            EXIT_EP_UNAVAILABLE,
        )
    failed = [row for row in rows if _judged_status(row) == Status.FAIL]
    if failed:
        first = failed[0]
        where = f"{first['engine']}/{first['ep']}"
        if first.get("input_set"):  # a user's model: its input set names the shape
            where += f" on input set {first['input_set']}"
        elif "batch" in first:
            where += f" at {first['batch']}x{first['seq']}"
        accuracy = first["accuracy"]
        said = [  # the comparator's words carry the way on (a padding mask, say)
            f"{name}: {output['message']}"
            for name, output in accuracy.get("outputs", {}).items()
            if output.get("status") == Status.FAIL and output.get("message")
        ]
        raise TconformError.with_code(
            f"{len(failed)} timed row(s) computed outputs outside their tolerance row; first "
            f"{where}: max abs error {accuracy['max_abs_err']:.3g} against the "
            f"{accuracy['precision']} row ({said[0] if said else 'see the table'})",
            EXIT_FAILURE,
        )


def _judged_status(row: Mapping[str, object]) -> str | None:
    accuracy = row.get("accuracy")
    return accuracy.get("status") if isinstance(accuracy, Mapping) else None

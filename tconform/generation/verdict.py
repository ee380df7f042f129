"""The generation verdict: tokens must match the oracle's exactly, except at a near-tie.

Row by row, the first step t where a runtime's token differs from the golden's (a different
token, or one sequence ended and the other did not) is the divergence. The oracle's
log-probability margin there is |lp[golden token] - lp[runtime token]|, read from the golden's
step distribution (both runs share the prefix up to t). Each of the two log-probabilities may
be off by its tolerance (atol + rtol * |lp|, the step log-probabilities' row of the tolerance
table), so a margin within the sum of both tolerances is a `tie`: the runtime picked a token the
oracle ranks as a near-equal, and the comparison of that row stops there. A larger margin is a
failure. Step distributions are compared by the usual tolerance rule over every step up to and
including the divergence (all steps when there is none).

For beam search and sampling the margin is the same local one along the golden's sequence:
it says how close the oracle's step was, not how close the two finished hypotheses are.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tconform.compare import TOLERANCES, OutputComparison, Tolerance, compare_output, tolerance_for
from tconform.generation.driver import Generation
from tconform.results import Status


def step_tolerance(precision: str) -> Tolerance:
    """The tolerance of a generation model's step log-probabilities: the "generation" row of
    tconform.compare.TOLERANCES where the precision has one, else its "model" row."""
    return TOLERANCES.get((precision, "generation")) or tolerance_for(precision, "model")


@dataclass(frozen=True)
class Divergence:
    row: int
    step: int
    golden_token: int
    actual_token: int
    margin: float  # the oracle's |log p(golden token) - log p(actual token)| at that step
    threshold: float  # margins up to this are ties

    @property
    def is_tie(self) -> bool:
        return self.margin <= self.threshold

    def describe(self) -> str:
        verdict = "tie" if self.is_tie else "fail"
        return (
            f"row {self.row} step {self.step}: oracle token {self.golden_token}, got "
            f"{self.actual_token}; oracle log-prob margin {self.margin:.3g} "
            f"({'<=' if self.is_tie else '>'} {self.threshold:.3g}: {verdict})"
        )


@dataclass
class Verdict:
    status: Status
    divergences: list[Divergence]
    log_probs: OutputComparison | None
    message: str


def first_divergence(golden: Generation, actual: Generation, row: int) -> int | None:
    """The first step at which the two rows' tokens differ (None: identical)."""
    length = max(int(golden.lengths[row]), int(actual.lengths[row]))
    steps = min(length, golden.tokens.shape[1], actual.tokens.shape[1])
    differ = golden.tokens[row, :steps] != actual.tokens[row, :steps]
    differ |= np.arange(steps) >= min(golden.lengths[row], actual.lengths[row])
    if differ.any():
        return int(np.argmax(differ))
    return None if golden.lengths[row] == actual.lengths[row] else steps


def tie_threshold(tol: Tolerance, a: float, b: float) -> float:
    """The largest margin two log-probabilities within `tol` of the oracle's can swap across."""
    return 2 * tol.atol + tol.rtol * (abs(a) + abs(b))


def judge(golden: Generation, actual: Generation, tol: Tolerance) -> Verdict:
    divergences: list[Divergence] = []
    compared = np.zeros(golden.tokens.shape, dtype=bool)
    for row in range(len(golden.tokens)):
        step = first_divergence(golden, actual, row)
        upto = int(golden.lengths[row]) if step is None else step + 1
        compared[row, : min(upto, int(golden.lengths[row]), int(actual.lengths[row]))] = True
        if step is None:
            continue
        if step >= min(golden.tokens.shape[1], actual.tokens.shape[1]):
            divergences.append(Divergence(row, step, -1, -1, np.inf, 0.0))
            continue
        lp = golden.log_probs[row, step].astype(np.float64)
        g, a = int(golden.tokens[row, step]), int(actual.tokens[row, step])
        with np.errstate(invalid="ignore"):
            margin = float(abs(lp[g] - lp[a]))
        if np.isnan(margin):  # a NaN distribution: no order to be near
            margin = np.inf if g != a else 0.0
        divergences.append(Divergence(row, step, g, a, margin, tie_threshold(tol, lp[g], lp[a])))
    log_probs = compare_output(
        "step_log_probs",
        actual.log_probs[compared],
        golden.log_probs[compared].astype(np.float64),
        tol,
    )
    failures = [d for d in divergences if not d.is_tie]
    if failures or log_probs.status == "fail":
        status = Status.FAIL
    elif divergences:
        status = Status.TIE
    else:
        status = Status.PASS
    lines = [d.describe() for d in divergences]
    if log_probs.status == "fail":
        lines.append(f"step log-probs: {log_probs.message}")
    return Verdict(status, divergences, log_probs, "; ".join(lines))

"""The tie rule on constructed step distributions."""

import numpy as np
import pytest

from tconform.compare import Tolerance
from tconform.generation.driver import Generation
from tconform.generation.verdict import judge, tie_threshold
from tconform.results import Status

pytestmark = pytest.mark.unit

TOL = Tolerance(1e-5, 1e-5, "test")
VOCAB = 6


def _golden(gap: float) -> Generation:
    """Two rows of three steps; at step 1 of row 0, token 3 leads token 4 by `gap`."""
    log_probs = np.full((2, 3, VOCAB), -4.0)
    log_probs[:, :, 1] = -0.5
    log_probs[0, 1, 3] = -1.0
    log_probs[0, 1, 4] = -1.0 - gap
    tokens = np.array([[1, 3, 1], [1, 1, 1]])
    return Generation(tokens, np.array([3, 3]), log_probs)


def _actual(golden: Generation, token: int, noise: float = 0.0) -> Generation:
    tokens = golden.tokens.copy()
    tokens[0, 1] = token
    return Generation(tokens, golden.lengths.copy(), golden.log_probs + noise)


def test_identical_tokens_pass():
    golden = _golden(0.3)
    verdict = judge(golden, _actual(golden, 3, noise=2e-6), TOL)
    assert verdict.status == Status.PASS and not verdict.divergences


def test_a_split_within_the_margin_is_a_tie_with_step_and_tokens():
    golden = _golden(1e-6)
    verdict = judge(golden, _actual(golden, 4), TOL)
    assert verdict.status == Status.TIE
    (found,) = verdict.divergences
    assert (found.row, found.step, found.golden_token, found.actual_token) == (0, 1, 3, 4)
    assert found.margin == pytest.approx(1e-6)
    assert "row 0 step 1" in verdict.message and "tie" in verdict.message


def test_a_split_beyond_the_margin_fails():
    golden = _golden(1e-3)
    verdict = judge(golden, _actual(golden, 4), TOL)
    assert verdict.status == Status.FAIL
    assert verdict.divergences[0].margin > verdict.divergences[0].threshold


def test_the_threshold_is_both_tolerances():
    assert tie_threshold(TOL, -1.0, -1.0) == pytest.approx(2e-5 + 2e-5)
    golden = _golden(tie_threshold(TOL, -1.0, -1.0) * 0.99)
    assert judge(golden, _actual(golden, 4), TOL).status == Status.TIE
    golden = _golden(tie_threshold(TOL, -1.0, -1.0) * 1.5)
    assert judge(golden, _actual(golden, 4), TOL).status == Status.FAIL


def test_log_probs_outside_tolerance_before_the_divergence_fail():
    golden = _golden(0.3)
    verdict = judge(golden, _actual(golden, 3, noise=1e-3), TOL)
    assert verdict.status == Status.FAIL and "step log-probs" in verdict.message


def test_a_sequence_that_ends_early_is_a_divergence():
    golden = _golden(0.3)
    actual = _actual(golden, 3)
    actual.lengths = np.array([2, 3])
    actual.tokens[0, 2] = 0
    verdict = judge(golden, actual, TOL)
    assert verdict.status == Status.FAIL and verdict.divergences[0].step == 2

import numpy as np
import pytest

from tconform.doc import verdict

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("printed", "unit"),
    [
        ("1.49", 0.01),
        ("-0.016", 0.001),
        ("8", 1.0),
        ("0.", 1.0),
        ("8.1903e-06", 1e-10),
        ("1.0000e+00", 1e-4),
        ("-0.9899925", 1e-7),
    ],
)
def test_unit_of_the_last_printed_digit(printed, unit):
    assert verdict.last_digit_unit(printed) == pytest.approx(unit, rel=1e-12)


def test_truncation_and_rounding_both_hold():
    exact = np.array([1.49995, 0.84147, 0.41])  # 1.49 is truncated, 0.84 rounded
    ruling, worst, off = verdict.judge_printed(np.array(["1.49", "0.84", "0.41"]), exact)
    assert ruling == verdict.HOLDS and not off.any()
    assert worst == pytest.approx(0.00995)


def test_more_than_one_unit_off_is_an_erratum():
    ruling, _, off = verdict.judge_printed(np.array(["0.895", "0.41"]), np.array([0.63, 0.41]))
    assert ruling == verdict.ERRATUM
    assert off.tolist() == [True, False]


def test_expressions_are_judged_by_their_value_to_float64_noise():
    assert verdict.judge_expressions(np.zeros(2), np.zeros(2))[0] == verdict.HOLDS
    exact = np.array([0.8218, 1.0])
    ruling, worst, off = verdict.judge_expressions(exact + np.array([1e-9, 0.0]), exact)
    assert ruling == verdict.ERRATUM and off.tolist() == [True, False]
    assert worst == pytest.approx(1e-9)

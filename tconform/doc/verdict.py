"""Verdicts: does a number printed in a document equal the exact value?

A printed number is held as the string the document prints, so its precision is known: the unit
of its last printed digit ("1.49" -> 0.01, "-0.016" -> 0.001, "8.1903e-06" -> 1e-10). A printed
number holds when it lies within one such unit of the exact value, which accepts both rounding
and truncation to the printed digits.

Verdicts:
  holds     every printed number is within one unit of its last digit of the exact value
  erratum   at least one printed number is further off (the case carries the exact values)
  deviates  a code listing computes something other than the formula printed beside it
  differs   a number quoted from outside the five documents (the paper's Table 3 parameter
            counts) is not within the stated relative tolerance of our count
"""

from __future__ import annotations

from decimal import Decimal

import numpy as np

HOLDS = "holds"
ERRATUM = "erratum"
DEVIATES = "deviates"
DIFFERS = "differs"
VERDICTS = (HOLDS, ERRATUM, DEVIATES, DIFFERS)

# Exact expressions (not rounded decimals) must agree to float64 evaluation noise.
EXPRESSION_UNIT = 1e-12


def last_digit_unit(printed: str) -> float:
    """The value of one unit in the last printed digit: "0.84" -> 0.01, "1.2313e-18" -> 1e-22."""
    exponent = Decimal(printed.strip()).as_tuple().exponent
    assert isinstance(exponent, int), f"not a finite number: {printed!r}"
    return 10.0**exponent


def units(printed: np.ndarray) -> np.ndarray:
    """Elementwise last_digit_unit over an array of printed strings."""
    return np.vectorize(last_digit_unit, otypes=[float])(printed)


def decimals(printed: np.ndarray) -> int | list:
    """-log10 of each unit: an int when all agree, else the nested list (for the JSON report)."""
    digits = np.rint(-np.log10(units(printed))).astype(int)
    return int(digits.flat[0]) if np.all(digits == digits.flat[0]) else digits.tolist()


def as_numbers(printed: np.ndarray) -> np.ndarray:
    return np.vectorize(float, otypes=[float])(printed)


def judge_printed(printed: np.ndarray, exact: np.ndarray) -> tuple[str, float, np.ndarray]:
    """(verdict, worst |printed - exact|, mask of printed numbers off by more than one unit).

    A float64 slack of 1e-12 relative keeps an exact tie (1.49 vs 1.50 for a unit of 0.01)
    from failing on representation error.
    """
    values = as_numbers(printed)
    deviation = np.abs(values - exact)
    off = deviation > units(printed) * (1 + 1e-9) + 1e-12 * np.abs(exact)
    return (ERRATUM if off.any() else HOLDS), float(deviation.max()), off


def judge_expressions(written: np.ndarray, exact: np.ndarray) -> tuple[str, float, np.ndarray]:
    """Exact expressions, evaluated as written: off where the value differs from the exact one
    beyond float64 noise. An expression in a wrong form whose value still agrees (sin(0/...)
    is 0 whatever the exponent) holds; the case's note says so."""
    deviation = np.abs(written - exact)
    off = deviation > EXPRESSION_UNIT * np.maximum(1.0, np.abs(exact))
    return (ERRATUM if off.any() else HOLDS), float(deviation.max()), off

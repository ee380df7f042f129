import json

import numpy as np
import pytest

from tconform.compare import Tolerance, compare_output

pytestmark = pytest.mark.unit

TOL = Tolerance(1e-5, 1e-4, "test")


def test_rule_is_atol_plus_rtol_times_golden():
    golden = np.array([0.0, 1.0, 100.0], dtype=np.float32)
    edge = golden + np.array([1e-5, 1e-5 + 1e-4, 1e-5 + 1e-2], dtype=np.float64) * 0.99
    assert compare_output("y", edge.astype(np.float32), golden, TOL).status == "pass"
    over = golden.astype(np.float64) + np.array([0, 0, 1e-5 + 1e-2]) * 1.5
    result = compare_output("y", over.astype(np.float32), golden, TOL)
    assert result.status == "fail" and result.kind == "values"
    assert result.mismatches == 1 and result.max_abs_index == [2]
    assert result.worst[0]["index"] == [2]
    assert result.tolerance_used > 1


def test_nan_in_output_fails_unless_golden_has_it_too():
    golden = np.array([1.0, 2.0], dtype=np.float32)
    result = compare_output("y", np.array([1.0, np.nan], dtype=np.float32), golden, TOL)
    assert result.status == "fail" and result.kind == "nonfinite"
    same = np.array([1.0, np.nan], dtype=np.float32)
    assert compare_output("y", same, same.copy(), TOL).status == "pass"


def test_infinities_must_match_in_sign():
    golden = np.array([np.inf, 1.0], dtype=np.float32)
    assert compare_output("y", golden.copy(), golden, TOL).status == "pass"
    flipped = np.array([-np.inf, 1.0], dtype=np.float32)
    assert compare_output("y", flipped, golden, TOL).kind == "nonfinite"


def test_shape_and_dtype_mismatch_are_their_own_failures():
    golden = np.zeros((2, 3), dtype=np.float32)
    assert compare_output("y", np.zeros((3, 2), np.float32), golden, TOL).kind == "shape"
    assert compare_output("y", np.zeros((2, 3), np.int64), golden, TOL).kind == "dtype"


def test_float16_output_compares_against_float32_golden():
    golden = np.array([1.0, 2.0], dtype=np.float32)
    result = compare_output("y", golden.astype(np.float16), golden, Tolerance(1e-2, 1e-2, ""))
    assert result.status == "pass"


@pytest.mark.parametrize("error, status, used", [(0.0, "pass", 0.0), (1e-9, "fail", None)])
def test_a_zero_tolerance_is_an_exactness_check_with_json_safe_figures(error, status, used):
    """atol = rtol = 0 (what `check --atol 0 --rtol 0` asks): exact is a pass that used none of
    it, any error a failure whose share is unbounded (None, since JSON has no Infinity)."""
    import warnings

    golden = np.array([0.0, 1.0, 2.0])
    actual = golden + np.array([0.0, error, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no division warning either
        result = compare_output("y", actual, golden, Tolerance(0, 0, "exact"))
    assert (result.status, result.tolerance_used) == (status, used)
    json.dumps(result.to_dict(), allow_nan=False)  # raises on NaN or Infinity

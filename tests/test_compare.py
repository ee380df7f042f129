import json

import numpy as np
import pytest

from tconform.compare import Tolerance, compare_output, judge_outputs
from tconform.golden import InputSet

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


def test_an_sqnr_floor_fails_noise_spread_evenly_within_the_element_bound():
    from tconform.compare import BFLOAT16, sqnr_db

    rng = np.random.default_rng(0)
    golden = rng.standard_normal(1000).astype(np.float32)
    noisy = golden + rng.choice([-0.05, 0.05], 1000).astype(np.float32)  # every element 0.05 off
    floor = Tolerance(0.1, 0.1, "test", min_sqnr_db=30.0)
    result = compare_output("y", noisy, golden, floor)
    measured = sqnr_db(noisy, golden)
    assert 25 < measured < 27 and result.sqnr_db == pytest.approx(measured, abs=1e-3)
    assert result.status == "fail" and result.kind == "sqnr" and result.mismatches == 0
    assert "below the row's floor of 30 dB" in result.message
    # The floor's share is in the element-wise share's units: the error RMS over the allowed.
    assert result.tolerance_used == pytest.approx(10 ** ((30 - measured) / 20), rel=1e-6)
    loose = Tolerance(0.1, 0.1, "test", min_sqnr_db=20.0)
    passed = compare_output("y", noisy, golden, loose)
    assert passed.status == "pass" and passed.tolerance_used < 1
    # Without a floor the SQNR is still recorded; an exact output has none (infinite).
    assert compare_output("y", noisy, golden, Tolerance(0.1, 0.1, "")).status == "pass"
    assert compare_output("y", golden, golden.copy(), floor).sqnr_db is None
    # bfloat16 outputs (ml_dtypes) compare against float32 goldens like any float type.
    assert compare_output("y", golden.astype(BFLOAT16), golden, floor).status == "pass"


def test_a_rows_atol_scales_down_to_an_output_far_below_it():
    """A row's atol stands for outputs of RMS 1: on logits of about 1e-6 (Segformer's, fresh
    from its config) a 1 % error passes 1e-5 unscaled, and is caught scaled. Large outputs are
    never loosened; the report carries the atol used, the output's RMS and a note."""
    from tconform.compare import tolerance_for

    row = tolerance_for("float32", "model")
    golden = np.random.default_rng(0).standard_normal(200) * 1e-6
    off = golden * 1.01
    unscaled = Tolerance(row.atol, row.rtol, "as given")
    assert compare_output("y", off, golden, unscaled).status == "pass"
    caught = compare_output("y", off, golden, row)
    assert caught.status == "fail" and caught.atol_scaled_from == row.atol
    assert caught.atol == pytest.approx(row.atol * caught.golden_rms)
    assert "atol scaled to the output's RMS" in caught.note
    clean = golden + 1e-7 * golden  # float32-sized rounding of the same output passes
    assert compare_output("y", clean, golden, row).status == "pass"
    within = golden * 5 / np.sqrt(np.mean(golden**2))  # RMS 5: the row's atol as it is
    big = compare_output("y", within, within, row)
    assert big.atol == row.atol and big.atol_scaled_from is None and big.note == ""


def test_a_rows_atol_grows_with_an_output_far_above_its_scale():
    """An output of RMS 6e4 (logits scaled up) held to the row's 1e-5 would ask float32 for
    2e-10 of its size, which its own rounding misses (torch's float32 run fails it): beyond ten
    times the rows' scale the atol grows in proportion, and a 1 % error still fails."""
    from tconform.compare import GROWN_ABOVE, tolerance_for

    row = tolerance_for("float32", "model")
    rng = np.random.default_rng(0)
    golden = rng.standard_normal(200) * 6e4
    rounded = golden + rng.standard_normal(200) * 6e4 * 2e-7  # float32-sized rounding
    grown = compare_output("y", rounded, golden, row)
    typical = min(grown.golden_rms, grown.golden_median)
    assert grown.status == "pass" and grown.atol == pytest.approx(row.atol * typical / GROWN_ABOVE)
    assert grown.golden_median == pytest.approx(np.median(np.abs(golden)))
    assert "atol grown to" in grown.note
    assert compare_output("y", golden * 1.01, golden, row).status == "fail"
    assert compare_output("y", rounded, golden, Tolerance(row.atol, row.rtol, "set")).status == (
        "fail"  # an atol the user set is taken as given
    )


def test_a_few_huge_values_do_not_grow_the_atol_of_the_rest():
    """Logits with a masked part of the vocabulary (-1e4 on a tenth of it) have an RMS of about
    3e3, set by the mask alone: the rest keeps its own size, so its atol is not grown with the
    RMS, and a 1 % error in the real logits (under half an RMS-grown atol) fails."""
    from tconform.compare import tolerance_for

    row = tolerance_for("float32", "model")
    rng = np.random.default_rng(0)
    golden = rng.standard_normal(1000) * 0.05
    golden[-100:] = -1e4
    wrong = golden.copy()
    wrong[:-100] *= 1.01
    judged = compare_output("logits", wrong, golden, row)
    assert judged.golden_rms > 1e3 and judged.atol == row.atol
    assert judged.status == "fail" and judged.mismatches > 0
    clean = golden + np.abs(golden) * 2e-7 * rng.standard_normal(1000)  # float32 rounding
    assert compare_output("logits", clean, golden, row).status == "pass"


def test_exact_zeros_do_not_hold_back_the_growth_of_the_rest():
    """A ReLU's output of RMS 3e3, 60 % exact zeros: its nonzero values set its typical size,
    so the atol grows with them and float32's rounding of the values near zero passes."""
    from tconform.compare import GROWN_ABOVE, tolerance_for

    row = tolerance_for("float32", "model")
    rng = np.random.default_rng(1)
    golden = np.maximum(rng.standard_normal(1000) * 5e3, 0.0)
    golden[rng.random(1000) < 0.2] = 0.0
    rounded = np.where(golden > 0, golden + 5e3 * 2e-7 * rng.standard_normal(1000), 0.0)
    judged = compare_output("y", rounded, golden, row)
    assert judged.golden_median == pytest.approx(np.median(golden[golden > 0]))
    assert judged.atol == pytest.approx(row.atol * judged.golden_rms / GROWN_ABOVE, rel=0.5)
    assert judged.status == "pass"


def test_an_all_zero_golden_keeps_the_atol_as_given():
    """RMS 0 has no scale to shrink to: the atol is not turned into an exactness check."""
    from tconform.compare import tolerance_for

    row = tolerance_for("float32", "model")
    result = compare_output("y", np.full(4, 1e-9), np.zeros(4), row)
    assert result.status == "pass" and result.atol == row.atol and result.golden_rms == 0.0


def test_an_atol_given_above_the_outputs_rms_is_kept_and_warned_about():
    golden = np.random.default_rng(0).standard_normal(50) * 1e-6
    result = compare_output("y", golden * 1.5, golden, Tolerance(1e-5, 1e-5, "set by the user"))
    assert result.status == "pass" and result.atol == 1e-5
    assert result.note.startswith("warning: y: atol 1e-05 is above the output's RMS")


def test_a_pass_under_an_atol_given_above_the_outputs_rms_is_not_a_pass():
    """A tolerance that cannot see an output is no check of it: a 50 % error passes an atol
    above the values, so the result is `skip` saying why (nothing checked is never a pass);
    a measured row, scaled to the output, and an atol below the values stay judged."""
    from tconform.execution import settle
    from tconform.results import Result

    golden = np.random.default_rng(0).standard_normal(50) * 1e-6
    given = Tolerance(1e-5, 1e-5, "set by the user", given=True)
    result = settle(Result("m", "m", "onnxruntime", "cpu", ["cpu"], "example", "pass"), [
        compare_output("y", golden * 1.5, golden, given)
    ])  # fmt: skip
    assert result.status == "skip" and "cannot see it" in result.message
    below = Tolerance(1e-8, 1e-5, "set by the user", given=True)
    assert compare_output("y", golden * 1.5, golden, below).status == "fail"
    row = Tolerance(1e-5, 1e-5, "a row", atol_rms=1.0)  # shrunk to the output: judged
    judged = settle(Result("m", "m", "onnxruntime", "cpu", ["cpu"], "example", "pass"), [
        compare_output("y", golden * 1.5, golden, row)
    ])  # fmt: skip
    assert judged.status == "fail"


@pytest.mark.parametrize("rtol", [1.0, 1e30])
def test_a_pass_under_an_rtol_given_of_one_or_more_is_not_a_pass(rtol):
    """|err| <= rtol * |golden| with rtol >= 1 lets an error as large as each value pass (all
    zeros, a flipped sign at rtol 2): such a given tolerance sees nothing, whatever its atol,
    and a pass under it is `skip` saying why; an rtol below 1 stays judged."""
    from tconform.execution import settle
    from tconform.results import Result

    golden = np.random.default_rng(0).standard_normal(50)
    wrong = -3 * golden + 1e-3  # far off: four times the value's size
    blind = Tolerance(0.0, rtol, "set by the user", given=True)
    result = settle(Result("m", "m", "onnxruntime", "cpu", ["cpu"], "example", "pass"), [
        compare_output("y", np.zeros_like(golden) if rtol == 1 else wrong, golden, blind)
    ])  # fmt: skip
    assert result.status == "skip" and "is 1 or more" in result.message
    seeing = Tolerance(0.0, 0.5, "set by the user", given=True)
    assert compare_output("y", wrong, golden, seeing).status == "fail"


def test_a_comparison_in_chunks_gives_the_figures_of_one_pass(monkeypatch):
    """The comparator reads a large output a chunk at a time (memory); its figures are those of
    the whole output at once: worst element, counts, SQNR, the worst list, masks."""
    from tconform import compare

    rng = np.random.default_rng(0)
    golden = rng.standard_normal((6, 7, 5)).astype(np.float32)
    actual = golden + rng.standard_normal(golden.shape).astype(np.float32) * 1e-4
    actual[2, 3, 1], golden[4, 0, 0], actual[4, 0, 0] = np.nan, np.inf, np.inf
    keep = rng.random((6, 1, 1)) < 0.7
    floor = Tolerance(1e-4, 1e-4, "test", min_sqnr_db=60.0, atol_rms=1.0)
    whole = compare_output("y", actual, golden, floor, where=keep).to_dict()
    monkeypatch.setattr(compare, "CHUNK", 11)  # 210 elements in 20 chunks
    chunked = compare_output("y", actual, golden, floor, where=keep).to_dict()
    for key, value in whole.items():
        if isinstance(value, float):
            assert chunked[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert chunked[key] == value, key


def test_a_golden_near_float64s_maximum_has_its_rms_and_a_finite_atol():
    from tconform.compare import GROWN_ABOVE, tolerance_for

    golden = np.array([1e200, -1e200, 0.0, 3.0])
    result = compare_output("y", golden.copy(), golden, tolerance_for("float32", "model"))
    assert result.golden_rms == pytest.approx(1e200 / np.sqrt(2))
    assert result.status == "pass" and np.isfinite(result.atol)
    assert result.atol == pytest.approx(1e-5 * result.golden_rms / GROWN_ABOVE)
    json.dumps(result.to_dict(), allow_nan=False)


def test_tolerances_near_float64s_maximum_pass_without_a_warning():
    import warnings

    golden = np.random.default_rng(0).standard_normal(10)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # numpy's overflow in atol + rtol*|g|
        result = compare_output("y", golden, golden, Tolerance(1e308, 1e308, "set by the user"))
    assert result.status == "pass"


def _left_padded_failure(real_error: float):
    """A (2, 4, 3) output whose sample 1 starts with two padded positions of large error, and a
    real error `real_error` at one real position."""
    golden = np.ones((2, 4, 3))
    actual = golden.copy()
    actual[1, :2] += 0.5  # padded positions: their outputs are anyone's
    actual[0, 3, 1] += real_error
    mask = np.ones((2, 4), dtype=np.int64)
    mask[1, :2] = 0
    judge = judge_outputs(lambda precision, name: TOL)
    (found,) = judge({"y": actual}, InputSet("set", {"mask": mask}, {"y": golden}), "float32")
    return found


def test_a_failure_only_in_padding_says_so_and_names_the_option():
    found = _left_padded_failure(0.0)
    assert found.status == "fail"
    assert "every element outside tolerance lies where mask is 0" in found.message
    assert "--padding-mask mask" in found.message


def test_a_real_failure_beside_padding_names_the_padding_count_and_the_real_worst():
    """The headline's worst element is the padding's (0.5); the note says how many of the
    failing elements are padding and where the real positions' worst lies."""
    found = _left_padded_failure(0.01)
    assert found.status == "fail" and found.mismatches == 7
    assert "6 of them lie where mask is 0" in found.message
    assert "at the real positions 1 are outside, worst |err| 0.01 at [0, 3, 1]" in found.message
    assert "--padding-mask mask" in found.message


@pytest.mark.parametrize(
    ("actual", "where"),
    [
        (np.zeros((2, 0), np.float32), None),  # an empty output
        (np.ones((2, 3), np.float32), np.zeros((2, 3), bool)),  # every element masked out
    ],
)
def test_nothing_compared_measures_no_error(actual, where):
    """An output none of whose elements was compared shows no figures (a table printed
    0.00e+00 and 0.0% for it, as if measured), and its pass shows nothing: skip."""
    tol = Tolerance(1e-5, 1e-5, "t")
    c = compare_output("out", actual, actual.astype(np.float64), tol, where=where)
    assert (c.max_abs_err, c.max_rel_err, c.tolerance_used) == (None, None, None)
    assert c.unseen() == "no element compared"

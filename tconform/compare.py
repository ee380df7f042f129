"""The comparator: one tolerance rule, one table of tolerances, error statistics per output.

An element passes when |actual - golden| <= atol + rtol * |golden| (the rule of ONNX's backend
test runner and ONNX Runtime's onnx_test_runner). A NaN or infinity passes only where the golden
holds the same value at the same place; a shape or dtype mismatch is a failure of its own kind.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field

import ml_dtypes
import numpy as np

from tconform.errors import UsageError

# NumPy has no bfloat16; ml_dtypes (onnx's own dependency) gives the dtype ONNX tools use.
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def is_float_dtype(dtype: np.dtype) -> bool:
    """A floating-point element type: NumPy's own, or bfloat16."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype == BFLOAT16


# The RMS of the outputs the rows of TOLERANCES were measured on: the tiny preset's outputs are
# O(1) (RMS 0.4 to 4; probabilities 0.05). A row's atol stands for that scale.
ROW_OUTPUT_RMS = 1.0
# An output up to this many times that scale keeps the row's atol; beyond it the atol grows with
# the output, since the rounding of the values flowing into it does (a row held to an output of
# RMS 6e4 asks float32 for 2e-10 of its size, which torch's own float32 run misses too). It grows
# with the output's typical size, not its RMS alone: a few huge values (a masked vocabulary's
# -1e4 logits) raise the RMS, not the rounding of the rest.
GROWN_ABOVE = 10.0


@dataclass(frozen=True)
class Tolerance:
    """atol and rtol bound every element; min_sqnr_db, where set, also bounds the output as a
    whole: its signal-to-quantisation-noise ratio against the golden, 10 log10(sum g^2 /
    sum (a - g)^2), must reach it (the rows of quantised models, whose per-element noise is
    too wide for an element-wise bound alone to catch much: docs/tolerances.md).

    atol_rms: the output RMS the atol was set for (the rows': ROW_OUTPUT_RMS). An output of a
    smaller RMS is held to an atol shrunk in proportion: an atol above an output's values
    would pass any error in them; one whose typical size (atol_for) is over GROWN_ABOVE times
    it, to an atol grown in proportion beyond that. None: the atol is taken as given (one a
    user set)."""

    atol: float
    rtol: float
    why: str
    min_sqnr_db: float | None = None
    atol_rms: float | None = None
    given: bool = False  # a user's (check --atol, --tolerance), not a measured row

    def atol_for(self, rms: float | None, median: float | None = None) -> float:
        """The atol an output of RMS `rms` (its golden's finite elements) is held to; it grows
        with the smaller of `rms` and `median`, the median magnitude of its nonzero elements
        (its typical size, which a few huge values leave alone and exact zeros do not pull
        down). An all-zero golden (RMS 0) has no scale to shrink to: the atol as given, so
        that it is no exactness trap."""
        if self.atol_rms is None or not rms:
            return self.atol
        if rms < self.atol_rms:
            return self.atol * rms / self.atol_rms
        return self.atol * max(1.0, typical_size(rms, median) / self.atol_rms / GROWN_ABOVE)


def typical_size(rms: float, median: float | None) -> float:
    """An output's typical size, which its atol grows with: the smaller of its RMS and the
    median magnitude of its nonzero elements (None: none to take)."""
    return rms if median is None else min(rms, median)


def _row(atol: float, rtol: float, why: str, min_sqnr_db: float | None = None) -> Tolerance:
    """A row of TOLERANCES: measured on outputs of RMS about ROW_OUTPUT_RMS."""
    return Tolerance(atol, rtol, why, min_sqnr_db, atol_rms=ROW_OUTPUT_RMS)


# (precision, tolerance class) -> tolerance. Precision is the model's dtype, or "tf32" for CUDA
# float32 runs that allow TF32 matrix products. The classes come from registry.Case.tolerance.
# The float32 rows sit 8-15x above the worst error that ONNX Runtime CPU and torch eager show on
# the committed tiny goldens (docs/tolerances.md has the measurement and how to repeat it): room
# for another CPU's summation order, while a wrong mask, a dropped bias or a transposed weight
# (errors of 1e-2 and more) fail by orders of magnitude.
TOLERANCES: dict[tuple[str, str], Tolerance] = {
    ("float32", "component"): _row(
        3e-6, 3e-6, "one or two float32 reductions over d_model or d_ff: a few ulp of O(1) values"
    ),
    ("float32", "layer"): _row(
        5e-6, 5e-6, "about ten chained reductions; normalisation divides by a sample std"
    ),
    ("float32", "stack"): _row(8e-6, 8e-6, "N layers compound the per-layer rounding"),
    ("float32", "model"): _row(
        1e-5, 1e-5, "two stacks plus embeddings scaled by sqrt(d_model) and the vocabulary softmax"
    ),
    ("tf32", "component"): _row(
        5e-3, 5e-3, "TF32 keeps 10 mantissa bits in matrix products: 2^-11 relative per product"
    ),
    ("tf32", "layer"): _row(1e-2, 1e-2, "TF32 error compounded over a layer"),
    ("tf32", "stack"): _row(3e-2, 3e-2, "TF32 error compounded over a stack"),
    ("tf32", "model"): _row(3e-2, 3e-2, "TF32 error compounded over the whole model"),
    # The step log-probabilities of the generation goldens' trained checkpoint, which span about
    # 35 nats (a sure model): float32 rounding grows with that spread, and ONNX Runtime, torch
    # and OpenVINO differ from the oracle by up to 1.3e-4 on the committed goldens, in the unsure
    # rows (left padding, which it never saw) where log-probabilities sit near -2. About 8x that
    # worst error (docs/generation.md); an off-by-one position or a dropped bias moves them by
    # 1e-2 and more. Other precisions use their "model" row.
    ("float32", "generation"): _row(
        1e-3, 1e-5, "float32 log-probabilities of the trained checkpoint, spread about 35 nats"
    ),
    ("float16", "component"): _row(
        1e-2, 1e-2, "float16 has 11 significant bits: 2^-11 ~ 5e-4 relative per rounding"
    ),
    ("float16", "layer"): _row(3e-2, 3e-2, "float16 error compounded over a layer"),
    ("float16", "stack"): _row(6e-2, 6e-2, "float16 error compounded over a stack"),
    ("float16", "model"): _row(6e-2, 6e-2, "float16 error compounded over the whole model"),
    # Reduced-precision graphs (docs/tolerances.md has the measured distributions): atol = rtol
    # about 2.3x the smallest that passes every clean export of the tiny goldens on every runtime
    # that runs it, and an SQNR floor 6 dB under the lowest clean SQNR of any output on any set,
    # so a clean model uses at most half of either. The element-wise bound alone is wide enough
    # to let most mistakes through (docs/sensitivity.md); the floor is what catches them.
    ("int8", "component"): _row(
        0.1, 0.1, "int8 weights (7-bit range) and per-call uint8 activations", min_sqnr_db=27.0
    ),
    ("int8", "layer"): _row(
        0.15, 0.15, "int8 quantisation noise of six to ten matrix products", min_sqnr_db=29.0
    ),
    ("int8", "stack"): _row(
        0.3, 0.3, "int8 quantisation noise compounded over a stack", min_sqnr_db=24.0
    ),
    ("int8", "model"): _row(
        0.4, 0.4, "int8 noise over the whole model, on logits of small spread", min_sqnr_db=14.0
    ),
    # int4 weights (MatMulNBits: 4-bit blocks of 32 with one scale each, round to nearest) are
    # far noisier than int8 on the tiny goldens' d_model 16: a clean export's logits reach only
    # 8.4 dB SQNR and need t = 1.06. The rows follow the same rule as int8's; the element bound
    # sees little at this width, and the SQNR floor is what still refuses a structural mistake
    # (docs/sensitivity.md measures which). They were measured with the atol as given, so they
    # are not scaled to an output's RMS (no atol_rms), unlike the rows measured under that rule.
    ("int4", "component"): Tolerance(
        0.6, 0.6, "4-bit weights in blocks of 32, one scale per block", min_sqnr_db=9.0
    ),
    ("int4", "layer"): Tolerance(
        0.6, 0.6, "4-bit weight noise of six to ten matrix products", min_sqnr_db=13.0
    ),
    ("int4", "stack"): Tolerance(
        1.0, 1.0, "4-bit weight noise compounded over a stack", min_sqnr_db=7.0
    ),
    ("int4", "model"): Tolerance(
        2.5,
        2.5,
        "4-bit weight noise over the whole model, on logits of small spread",
        min_sqnr_db=2.0,
    ),
    ("bfloat16", "component"): _row(
        0.03,
        0.03,
        "bfloat16 keeps 8 significant bits: 2^-9 ~ 2e-3 relative per rounding",
        min_sqnr_db=36.0,
    ),
    ("bfloat16", "layer"): _row(
        0.05, 0.05, "bfloat16 rounding compounded over a layer", min_sqnr_db=35.0
    ),
    ("bfloat16", "stack"): _row(
        0.08, 0.08, "bfloat16 rounding compounded over a stack", min_sqnr_db=31.0
    ),
    ("bfloat16", "model"): _row(
        0.15, 0.15, "bfloat16 rounding compounded over the whole model", min_sqnr_db=25.0
    ),
}


# The rows above were measured on the tiny preset (d_model 16, two layers a side). float32
# rounding grows with the length of each reduction and with depth, so a preset whose own errors
# were measured has its own row where they outgrow the tiny one: on the whole model at the base
# preset (d_model 512, six layers a side) the clean runtimes reach 1.7e-5 (OpenVINO f32, every
# executed node float32, 8x128), beyond the tiny row's 1e-5 (docs/versions.md, "OpenVINO
# float32 at the base preset"). The row keeps about the headroom the tiny rows keep: ~6x; its
# atol is scaled to an output's RMS as the tiny rows' are.
PRESET_TOLERANCES: dict[tuple[str, str, str], Tolerance] = {
    ("base", "float32", "model"): _row(
        1e-4, 1e-4, "float32 over the base model's 512-wide reductions and twelve layers"
    ),
    # Measured on the base goldens (results/reduced-precision/rows-base.md): one int8 product
    # over 512-wide rows needs 0.234 where tiny's 32-wide ones need 0.05, and bench's inputs
    # took torch-int8's SQNR to 27.3 dB; the layer, stack and model rows hold at base as they are.
    ("base", "int8", "component"): _row(
        0.35, 0.35, "int8 products over the base model's 512-wide rows", min_sqnr_db=24.0
    ),
}


def tolerance_for(precision: str, tolerance_class: str, preset: str | None = None) -> Tolerance:
    """The row of `precision` and `tolerance_class`: the preset's own where one was measured
    for it (PRESET_TOLERANCES), else the rows measured on the tiny preset."""
    measured = PRESET_TOLERANCES.get((str(preset), precision, tolerance_class))
    if measured is not None:
        return measured
    if (precision, tolerance_class) not in TOLERANCES:
        raise UsageError(
            f"no {precision} tolerance row in tconform.compare.TOLERANCES: results computed in "
            f"{precision} cannot be judged yet"
        )
    return TOLERANCES[(precision, tolerance_class)]


def tolerance_value(value: object, what: str) -> float:
    """A tolerance as a user gives it (`--atol 1e-4`, `tconform.check(atol=...)`): a finite
    number >= 0, else a UsageError naming `what`. NaN would pass nothing and compare as
    nothing, infinity would pass everything, and JSON holds neither."""
    if isinstance(value, bool) or not isinstance(value, int | float | str | np.number):
        raise UsageError(f"{what}: {value!r} is not a number")
    if isinstance(value, str) and not value.isascii():  # float() reads '٣' and '１' as digits
        raise UsageError(f"{what}: {value!r} is not a number in ASCII digits")
    try:
        number = float(value)
    except (ValueError, OverflowError):
        raise UsageError(f"{what}: {value!r} is not a number") from None
    if not math.isfinite(number) or number < 0:
        raise UsageError(f"{what}: {value!r} must be a finite number >= 0")
    return number


@dataclass
class OutputComparison:
    """How one output compares with its golden. status: pass or fail; kind says why it failed."""

    name: str
    shape: list[int]
    status: str
    kind: str  # ok | values | sqnr | nonfinite | shape | dtype
    atol: float  # the atol it was held to: the tolerance's, scaled to its RMS where that applies
    rtol: float
    max_abs_err: float | None = None
    max_abs_index: list[int] | None = None
    max_rel_err: float | None = None
    mean_abs_err: float | None = None
    mismatches: int = 0
    tolerance_used: float | None = None
    message: str = ""
    worst: list[dict[str, object]] = field(default_factory=list)
    excluded: int = 0  # elements left out of the comparison (padded positions, on request)
    # elements non-finite alike in the golden and the run (NaN and NaN, inf and inf of one
    # sign): they agree, and of themselves prove nothing (NaN or inf in, the same out of most
    # models)
    both_nonfinite: int = 0
    # 10 log10(sum g^2 / sum (a - g)^2) over the compared finite elements (None: no error at
    # all, an infinite ratio, or nothing compared); min_sqnr_db: the row's floor, if it has one
    sqnr_db: float | None = None
    min_sqnr_db: float | None = None
    # The RMS of the golden's compared finite elements and the median magnitude of the nonzero
    # ones (Tolerance.atol_for), and the tolerance's atol where it was scaled to them (None:
    # held to the atol as given); a fact worth a line, or "".
    golden_rms: float | None = None
    golden_median: float | None = None
    atol_scaled_from: float | None = None
    note: str = ""
    # A given atol at or above the output's RMS, or a given rtol of 1 or more: an error as
    # large as its values passes (all zeros pass), so a pass shows nothing (unseen)
    blind: bool = False

    @property
    def compared(self) -> int:
        """How many elements were compared."""
        return int(np.prod(self.shape)) - self.excluded

    @property
    def checked(self) -> bool:
        """Whether the comparison shows anything of the model: a finite element compared
        (NaN or infinite inputs give the same out of almost any model)."""
        return self.compared > self.both_nonfinite

    def unseen(self) -> str:
        """Why a pass of this comparison would show nothing of the model ('' where it shows
        something): every command makes such an output `skip`, never a pass."""
        if not self.compared:
            return "no element compared"
        if not self.checked:  # NaN or inf in, the same out: almost any model agrees
            return (
                "every element is NaN or infinite alike in the golden and the run: nothing "
                "finite compared"
            )
        if self.blind and self.rtol >= 1:
            return (
                f"the rtol given, {self.rtol:g}, is 1 or more: an error as large as each value "
                "passes (all zeros pass), so this tolerance cannot see it (give an rtol below 1)"
            )
        if self.blind:
            return (
                f"the atol given, {self.atol:g}, is at or above the output's RMS "
                f"{self.golden_rms:.2g}: an error as large as its values passes, so this "
                "tolerance cannot see it (give an atol below the values' scale)"
            )
        return ""

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _failure(name: str, actual: np.ndarray, tol: Tolerance, kind: str, message: str):
    return OutputComparison(
        name,
        list(actual.shape),
        "fail",
        kind,
        tol.atol,
        tol.rtol,
        message=message,
        min_sqnr_db=tol.min_sqnr_db,
    )


def sqnr_db(actual: np.ndarray, golden: np.ndarray) -> float:
    """Signal-to-quantisation-noise ratio of `actual` against `golden` in dB: 10 log10 of the
    golden's power over the error's (inf where they are equal; both as float64)."""
    g = np.asarray(golden, dtype=np.float64)
    noise = float(np.sum((np.asarray(actual, dtype=np.float64) - g) ** 2))
    signal = float(np.sum(g**2))
    if noise == 0.0:
        return math.inf
    if signal == 0.0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def sqnr_share(sqnr: float, floor: float) -> float:
    """An SQNR floor's share used, in the units of the element-wise share (1 = the line): the
    error's RMS over the RMS the floor allows, 10^((floor - sqnr) / 20)."""
    if math.isinf(sqnr):
        return 0.0 if sqnr > 0 else math.inf
    return 10.0 ** ((floor - sqnr) / 20.0)


def compare_output(
    name: str,
    actual: np.ndarray,
    golden: np.ndarray,
    tol: Tolerance,
    worst_count: int = 5,
    where: np.ndarray | None = None,
) -> OutputComparison:
    """Compare one output with its golden under `tol`; only where `where` (broadcast to the
    output's shape) is true, when given: the rest is counted as excluded."""
    if actual.shape != golden.shape:
        msg = f"shape {list(actual.shape)} != golden {list(golden.shape)}"
        return _failure(name, actual, tol, "shape", msg)
    if actual.dtype != golden.dtype and not (
        is_float_dtype(actual.dtype) and is_float_dtype(golden.dtype)
    ):
        return _failure(
            name, actual, tol, "dtype", f"dtype {actual.dtype} != golden {golden.dtype}"
        )

    a, g = actual.reshape(-1), golden.reshape(-1)  # views, for contiguous arrays
    keep = None if where is None else np.broadcast_to(where, actual.shape).reshape(-1)
    measured = bool(a.size if keep is None else np.count_nonzero(keep))
    rms, median = rms_of(g, keep), _median_magnitude(g, keep)
    atol = tol.atol_for(rms, median)
    tally = _Tally(atol, tol.rtol, worst_count)
    for start in range(0, a.size, CHUNK):
        part = slice(start, start + CHUNK)
        tally.add(start, a[part], g[part], None if keep is None else keep[part])

    sqnr = tally.sqnr
    low_sqnr = (
        tol.min_sqnr_db is not None
        and sqnr is not None
        and not tally.bad_nonfinite
        and sqnr < tol.min_sqnr_db
    )
    worst_used = tally.worst_used
    if tol.min_sqnr_db is not None and sqnr is not None:
        worst_used = max(worst_used, sqnr_share(sqnr, tol.min_sqnr_db))
    failed = tally.mismatches > 0 or low_sqnr
    result = OutputComparison(
        name,
        list(actual.shape),
        "fail" if failed else "pass",
        "ok",
        atol,
        tol.rtol,
        # None where no element was compared (an empty output): no error was measured
        max_abs_err=tally.max_abs_err if measured else None,
        max_abs_index=_index(tally.max_abs_at, actual.shape) if a.size else [],
        max_rel_err=tally.max_rel_err if measured else None,
        mean_abs_err=tally.err_sum / tally.finite if tally.finite else 0.0,
        mismatches=tally.mismatches,
        # None where unbounded: JSON has no Infinity (the mismatch count says it failed).
        tolerance_used=worst_used if math.isfinite(worst_used) and measured else None,
        excluded=0 if keep is None else int(keep.size - np.count_nonzero(keep)),
        both_nonfinite=tally.both_nonfinite,
        sqnr_db=round(sqnr, 3) if sqnr is not None and math.isfinite(sqnr) else None,
        min_sqnr_db=tol.min_sqnr_db,
        golden_rms=rms,
        golden_median=median,
        atol_scaled_from=tol.atol if atol != tol.atol else None,
        note=_atol_note(name, tol, atol, rms, median),
        # (an atol still scaled to the output, atol_rms, is the row's, not the user's)
        blind=bool(tol.given and ((rms and atol >= rms and tol.atol_rms is None) or tol.rtol >= 1)),
    )
    if tally.bad_nonfinite:
        k = tally.first_nonfinite
        result.kind = "nonfinite"
        result.message = (
            f"{tally.bad_nonfinite} non-finite value(s) where the golden differs, first at "
            f"{_index(k, actual.shape)}: got {np.float64(a[k])!r}, golden {np.float64(g[k])!r}"
        )
    elif tally.mismatches:
        result.kind = "values"
        result.message = (
            f"{result.mismatches} of {a.size} elements outside atol {atol:.3g} + rtol "
            f"{tol.rtol:g}*|golden|; worst |err| {result.max_abs_err:.3g} at {result.max_abs_index}"
        )
    elif low_sqnr:
        result.kind = "sqnr"
        result.message = (
            f"SQNR {sqnr:.1f} dB against the golden, below the row's floor of "
            f"{tol.min_sqnr_db:g} dB (every element within atol {atol:.3g} + rtol "
            f"{tol.rtol:g}*|golden|; worst |err| {result.max_abs_err:.3g})"
        )
    if failed:
        for k in tally.worst_elements():
            actual_k, golden_k = np.float64(a[k]), np.float64(g[k])
            result.worst.append(
                {
                    "index": _index(k, actual.shape),
                    "actual": _json_number(actual_k),
                    "golden": _json_number(golden_k),
                    "abs_err": _json_number(abs(actual_k - golden_k)),
                }
            )
    return result


# Elements compared at a time: each step's float64 temporaries are a few tens of MB, however
# large the output (the whole output at once took ten times its float64 size).
CHUNK = 1 << 21


def _index(flat: int, shape: tuple[int, ...]) -> list[int]:
    return [int(i) for i in np.unravel_index(flat, shape)]


class _Tally:
    """The figures of one comparison, gathered chunk by chunk of the flattened output."""

    def __init__(self, atol: float, rtol: float, worst_count: int) -> None:
        self.atol, self.rtol, self.worst_count = atol, rtol, worst_count
        self.max_abs_err = self.max_rel_err = self.worst_used = self.err_sum = 0.0
        self.max_abs_at = 0
        self.finite = self.mismatches = self.bad_nonfinite = self.both_nonfinite = 0
        self.first_nonfinite = -1
        self.signal = self.noise = 0.0
        self.candidates: list[tuple[float, int]] = []  # (score, flat index), each chunk's worst

    def add(self, start: int, actual: np.ndarray, golden: np.ndarray, keep) -> None:
        """The elements from flat index `start` on."""
        a, g = actual.astype(np.float64), golden.astype(np.float64)
        finite = np.isfinite(g) & np.isfinite(a)
        # Non-finite values match only themselves: NaN where the golden is NaN, inf of the
        # same sign.
        same_nonfinite = (np.isnan(a) & np.isnan(g)) | (np.isinf(a) & np.isinf(g) & (a == g))
        bad_nonfinite = ~finite & ~same_nonfinite
        if keep is not None:
            finite &= keep
            bad_nonfinite &= keep
            same_nonfinite &= keep
        self.both_nonfinite += int(np.count_nonzero(same_nonfinite))
        with np.errstate(invalid="ignore"):  # inf - inf where both are infinite: masked below
            diff = np.where(finite, a - g, 0.0)
        err = np.abs(diff)
        magnitude = np.abs(np.where(finite, g, 0.0))
        with np.errstate(over="ignore"):  # tolerances near float64's maximum: inf allows all
            allowed = self.atol + self.rtol * magnitude
        bad = (finite & (err > allowed)) | bad_nonfinite
        # The share of its allowance each element used; with none allowed (atol = rtol = 0, an
        # exactness check) an exact element used none and any error an unbounded share.
        with np.errstate(divide="ignore", invalid="ignore"):
            used = np.where(allowed > 0, err / allowed, np.where(err > 0, np.inf, 0.0))
            rel = np.where(magnitude > 0, err / magnitude, 0.0)
        if err.size:
            k = int(err.argmax())
            if err[k] > self.max_abs_err:
                self.max_abs_err, self.max_abs_at = float(err[k]), start + k
            self.max_rel_err = max(self.max_rel_err, float(rel.max()))
            self.worst_used = max(self.worst_used, float(used.max()))
        self.err_sum += float(err.sum())
        self.finite += int(np.count_nonzero(finite))
        self.mismatches += int(np.count_nonzero(bad))
        nonfinite = int(np.count_nonzero(bad_nonfinite))
        if nonfinite and not self.bad_nonfinite:
            self.first_nonfinite = start + int(np.argmax(bad_nonfinite))
        self.bad_nonfinite += nonfinite
        signal = np.where(finite, g, 0.0)
        with np.errstate(over="ignore"):  # near float64's maximum: an infinite ratio, no warning
            self.signal += float(np.dot(signal, signal))
            self.noise += float(np.dot(diff, diff))
        # Each chunk's most used elements, of which the output's worst are picked if it fails
        score = np.where(bad_nonfinite, np.inf, used)
        count = min(self.worst_count, score.size)
        if count:
            top = np.argpartition(score, score.size - count)[score.size - count :]
            self.candidates += [(float(score[k]), start + int(k)) for k in top]

    @property
    def sqnr(self) -> float | None:
        """10 log10(sum g^2 / sum (a - g)^2) over the compared finite elements (sqnr_db)."""
        if not self.finite:
            return None
        if self.noise == 0.0:
            return math.inf
        if self.signal == 0.0:
            return -math.inf
        return 10.0 * math.log10(self.signal / self.noise)

    def worst_elements(self) -> list[int]:
        """The flat indices of the elements that used most of their allowance."""
        ranked = sorted(self.candidates, key=lambda c: (-c[0], c[1]))
        return [k for _, k in ranked[: self.worst_count]]


# A row's atol scaled by more than this much (an output of RMS under a tenth of the one the row
# was set for) is worth a note: the atol printed in a report is then not the row's.
NOTED_SCALING = 0.1


def rms_of(golden: np.ndarray, keep: np.ndarray | None = None) -> float | None:
    """The root mean square of `golden`'s finite elements (where `keep`, of its shape, holds);
    None where there is none. Summed relative to the largest magnitude so far (as LAPACK's
    dnrm2 does), so that a float64 golden near its maximum does not overflow."""
    golden = golden.reshape(-1)
    keep = None if keep is None else keep.reshape(-1)
    scale, relative, count = 0.0, 0.0, 0  # RMS = scale * sqrt(relative / count)
    for start in range(0, golden.size, CHUNK):
        part = golden[start : start + CHUNK].astype(np.float64)
        wanted = np.isfinite(part)
        if keep is not None:
            wanted &= keep[start : start + CHUNK]
        values = np.abs(part[wanted])
        count += values.size
        largest = float(values.max()) if values.size else 0.0
        if largest > scale:
            relative *= (scale / largest) ** 2
            scale = largest
        if scale > 0:
            values /= scale
            relative += float(np.dot(values, values))
    return scale * math.sqrt(relative / count) if count else None


# The median magnitude is taken over at most this many elements, evenly spaced through the
# output: a figure of its typical size, not an exact statistic, and no copy of a large output.
MEDIAN_SAMPLE = 1 << 20


def _median_magnitude(golden: np.ndarray, keep: np.ndarray | None) -> float | None:
    """The median |value| of `golden`'s nonzero finite elements (where `keep` holds, when
    given), over an evenly spaced sample of at most MEDIAN_SAMPLE; None where there is none."""
    step = max(1, -(-golden.size // MEDIAN_SAMPLE))
    values = np.abs(golden[::step].astype(np.float64))
    wanted = np.isfinite(values) & (values > 0)
    if keep is not None:
        wanted &= keep[::step]
    return float(np.median(values[wanted])) if wanted.any() else None


def _atol_note(
    name: str, tol: Tolerance, atol: float, rms: float | None, median: float | None
) -> str:
    """A line where the atol and the output's scale are far apart: a row's atol scaled down a
    lot, or an atol taken as given that is larger than the output's RMS (most of the output's
    values lie within it of 0: an error as large as them passes)."""
    if tol.atol_rms is not None and atol < NOTED_SCALING * tol.atol:
        return (
            f"{name}: atol scaled to the output's RMS, far below {tol.atol_rms:g} (the scale "
            f"the atol {tol.atol:g} was set for; docs/tolerances.md)"
        )
    if tol.atol_rms is not None and atol > tol.atol:
        return (
            f"{name}: atol grown to {atol:.2g} with the output's typical size "
            f"{typical_size(rms, median):.2g} (the smaller of its RMS and its nonzero "
            f"values' median magnitude), over {GROWN_ABOVE:g} times the scale the atol "
            f"{tol.atol:g} was set for (float32 rounds in proportion to the values; "
            "docs/tolerances.md)"
        )
    if tol.atol_rms is None and rms and atol >= rms:
        return (
            f"warning: {name}: atol {atol:g} is above the output's RMS {rms:.2g}: most of its "
            "values lie within atol of 0, so an error as large as they are passes"
        )
    return ""


def _json_number(value: float) -> float | str:
    """A float for a report; "nan", "inf" or "-inf" as text, since JSON has no such numbers."""
    value = float(value)
    return value if math.isfinite(value) else str(value)


def judge_outputs(
    tolerance: Callable[[str, str], Tolerance],
    padding_mask: str | None = None,
    names: Sequence[str] = (),
):
    """The judge every command uses (tconform.execution.Judge): each expected output of the
    input set against the output of that name, or of that position where the model names its
    outputs otherwise (a model made elsewhere); `tolerance(precision, output name)`.

    padding_mask: an input of the set (1 = a real token, 0 = padding); an output whose leading
    axes are that input's shape (batch, sequence) is compared only where it is non-zero. A
    failure whose every element outside tolerance lies where such an input is 0 says so.
    names: the outputs' names as `tolerance` knows them, in order, where a model made elsewhere
    names them otherwise (its batch-consistency set is keyed by the model's names)."""

    def known(name: str, outputs: Mapping[str, np.ndarray]) -> str:
        if not names or name in names or name not in outputs:
            return name
        position = list(outputs).index(name)
        return names[position] if position < len(names) else name

    def judge(outputs: Mapping[str, np.ndarray], input_set, precision: str):
        expected = input_set.outputs
        if set(expected) <= set(outputs):
            pairs = [(name, outputs[name]) for name in expected]
        elif len(expected) == len(outputs):
            pairs = list(zip(expected, outputs.values(), strict=True))
        else:
            raise UsageError(
                f"returns {len(outputs)} outputs ({', '.join(outputs)}); {len(expected)} "
                f"{'is' if len(expected) == 1 else 'are'} expected ({', '.join(expected)})"
            )
        masks = {n: v for n, v in input_set.inputs.items() if mask_like(v)}
        if padding_mask is not None and padding_mask not in masks:
            raise UsageError(
                f"--padding-mask {padding_mask}: no input of that name holds a (batch, sequence) "
                f"mask of 0s and 1s (the inputs: {', '.join(input_set.inputs)})"
            )
        found = []
        for name, actual in pairs:
            actual = np.asarray(actual)
            keep = None
            if padding_mask is not None and _leads_with(actual, masks[padding_mask]):
                keep = expanded_mask(masks[padding_mask] != 0, actual.ndim)
            tol = tolerance(precision, known(name, outputs))
            comparison = compare_output(name, actual, expected[name], tol, where=keep)
            if comparison.status == "fail" and padding_mask is None:
                comparison.message += _padding_note(comparison, actual, expected[name], tol, masks)
            found.append(comparison)
        return found

    return judge


def mask_like(value: np.ndarray) -> bool:
    """A (batch, sequence) array of 0s and 1s (or booleans)."""
    value = np.asarray(value)
    if value.ndim != 2 or value.dtype.kind not in "biu":
        return False
    return bool(np.isin(value, (0, 1)).all())


def _leads_with(output: np.ndarray, mask: np.ndarray) -> bool:
    return output.ndim >= mask.ndim and output.shape[: mask.ndim] == mask.shape


def expanded_mask(keep: np.ndarray, ndim: int) -> np.ndarray:
    """A (batch, sequence) mask shaped to broadcast over a tensor of `ndim` dimensions that
    leads with it."""
    return keep.reshape(keep.shape + (1,) * (ndim - keep.ndim))


def _padding_note(comparison: OutputComparison, actual, expected, tol: Tolerance, masks) -> str:
    """Where elements outside tolerance lie at masked (padded) positions of one of the inputs:
    say how many, what remains at the real positions, and name the option that leaves the
    padded ones out (their outputs no framework defines, and their error can dwarf a real one)."""
    for name, mask in masks.items():
        if not _leads_with(actual, mask) or mask.all():
            continue
        where = expanded_mask(mask != 0, actual.ndim)
        real = compare_output("", actual, expected, tol, where=where)
        padded = comparison.mismatches - real.mismatches
        if real.status == "pass":
            return (
                f"; every element outside tolerance lies where {name} is 0 (padding, whose "
                "outputs no framework defines): compare the real positions only with "
                f"--padding-mask {name}"
            )
        if padded > 0:
            return (
                f"; {padded} of them lie where {name} is 0 (padding, whose outputs no "
                f"framework defines); at the real positions {real.mismatches} are outside, "
                f"worst |err| {real.max_abs_err:.3g} at {real.max_abs_index}: compare those "
                f"only with --padding-mask {name}"
            )
    return ""

"""Where two releases of one runtime part: the verdict says by which figure one is nearer the
float64 reference, and where the other figure disagrees."""

from __future__ import annotations

import pytest

from tconform.localise.versions import Parting

pytestmark = pytest.mark.unit


def _parting(a: tuple[float, float], b: tuple[float, float], nearer: str) -> Parting:
    errors = {
        label: {"max_abs_err": worst, "mean_abs_err": mean}
        for label, (worst, mean) in (("ort-cpu==1.20.1", a), ("ort-cpu", b))
    }
    return Parting(("ort-cpu==1.20.1", "ort-cpu"), "ln", "LayerNorm", errors, nearer, 3)


def test_the_nearer_release_is_named_by_its_mean_error_and_a_larger_worst_is_said():
    agreeing = _parting((4e-7, 5e-8), (3e-7, 4e-8), "ort-cpu").verdict
    assert agreeing.endswith("ort-cpu is nearer the float64 reference there (by mean abs err)")
    disagreeing = _parting((2.9e-7, 5e-8), (3.8e-7, 4e-8), "ort-cpu").verdict
    assert disagreeing.endswith("(by mean abs err; its max abs err is the larger)")

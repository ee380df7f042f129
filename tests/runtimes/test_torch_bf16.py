"""torch-bf16: the float32 reference module under torch.autocast("cpu", bfloat16), as a PyTorch
user runs it in bfloat16; it says it computes in bfloat16 (its tolerance row), hands its outputs
back as float32, and its compiled and int8 siblings are runtimes too."""

from __future__ import annotations

import numpy as np
import pytest

from tconform import registry
from tconform.compare import compare_output, tolerance_for
from tconform.config import PRESETS
from tconform.execution import Subject, case_module, open_subject
from tconform.export import ExportSettings, build_module, example_shape
from tconform.runtimes import RUNTIMES, make_runtime

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]


def test_autocast_computes_the_products_in_bfloat16_within_the_bfloat16_row():
    case = registry.get_case("feed_forward")
    _, params = build_module(case, ExportSettings(TINY))
    subject = Subject(module=case_module(case, TINY, params))
    feeds = registry.make_inputs(case, TINY, example_shape(TINY), np.random.default_rng(0))
    runtime = make_runtime("torch-bf16")
    assert runtime.settings()["autocast"] == {"device_type": "cpu", "dtype": "bfloat16"}
    with open_subject(runtime, subject) as opened:
        assert opened.precision == "bfloat16"
        (out,) = opened.run(feeds).values()
    with open_subject(make_runtime("torch"), subject) as eager:
        (reference,) = eager.run(feeds).values()
    assert out.dtype == np.float32 and out.shape == reference.shape
    error = np.abs(out - reference).max()
    assert error > 1e-4  # bfloat16 rounding: not the float32 module's numbers
    judged = compare_output("out", out, reference, tolerance_for("bfloat16", "component"))
    assert judged.status == "pass", judged.message


def test_the_compiled_and_quantised_siblings_are_runtimes_with_their_precision():
    precisions = {
        name: (make_runtime(name).precision, make_runtime(name).compiled)
        for name in ("torch-bf16", "torch-compile-bf16", "torch-int8", "torch-compile-int8")
    }
    assert precisions == {
        "torch-bf16": ("bfloat16", False),
        "torch-compile-bf16": ("bfloat16", True),
        "torch-int8": ("int8", False),
        "torch-compile-int8": ("int8", True),
    }
    assert set(precisions) <= set(RUNTIMES)

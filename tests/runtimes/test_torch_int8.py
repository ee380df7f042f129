"""torch-int8: the reference module with its Linear layers dynamically quantised by
torch.ao.quantization, run eagerly; it says it computes in int8 (its tolerance row)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tconform import registry
from tconform.config import PRESETS
from tconform.execution import Subject, case_module, open_subject
from tconform.export import ExportSettings, build_module, example_shape
from tconform.runtimes import make_runtime

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]


def test_every_linear_is_quantised_and_the_session_computes_in_int8():
    case = registry.get_case("feed_forward")
    _, params = build_module(case, ExportSettings(TINY))
    subject = Subject(module=case_module(case, TINY, params))
    feeds = registry.make_inputs(case, TINY, example_shape(TINY), np.random.default_rng(0))
    runtime = make_runtime("torch-int8")
    with open_subject(runtime, subject) as opened:
        module = opened.session.module
        assert not any(type(m) is torch.nn.Linear for m in module.modules())
        dynamic = torch.ao.nn.quantized.dynamic.Linear
        quantised = [m for m in module.modules() if isinstance(m, dynamic)]
        assert len(quantised) == 2  # the feed-forward's two Linear layers
        assert opened.precision == "int8"
        (out,) = opened.run(feeds)
    with open_subject(make_runtime("torch"), subject) as eager:
        (reference,) = eager.run(feeds)
    assert out.dtype == np.float32 and out.shape == reference.shape
    assert 0 < np.abs(out - reference).max() < 0.1  # quantisation noise, not another function
    assert runtime.settings()["quantization"]["dtype"] == "qint8"

"""The bench's engines: torch is timed with PyTorch's own floating-point defaults, whatever an
ONNX Runtime engine that flushes subnormal floats set on the calling thread before it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tconform import registry
from tconform.bench.engines import open_engine
from tconform.config import PRESETS
from tconform.execution import Subject, case_module
from tconform.export import ExportSettings, build_module, example_shape
from tconform.runtimes import make_runtime

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]


def test_torch_engine_keeps_subnormals_whatever_was_set_before(thread_flushes_subnormals):
    torch.set_flush_denormal(True)  # as an ONNX Runtime engine with flushing leaves the thread
    case = registry.get_case("feed_forward")
    _, params = build_module(case, ExportSettings(TINY))
    feeds = registry.make_inputs(case, TINY, example_shape(TINY), np.random.default_rng(0))
    subject = Subject(module=case_module(case, TINY, params))
    engine = open_engine(make_runtime("torch"), subject, feeds)
    engine.run()
    engine.close()
    assert not thread_flushes_subnormals()

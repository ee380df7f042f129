"""The bench's engines: torch is timed with PyTorch's own floating-point defaults, whatever an
ONNX Runtime engine that flushes subnormal floats set on the calling thread before it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tconform import registry
from tconform.bench.engines import open_torch
from tconform.config import PRESETS
from tconform.export import ExportSettings, build_module, example_shape

pytestmark = pytest.mark.unit

TINY = PRESETS["tiny"]


def test_torch_engine_keeps_subnormals_whatever_was_set_before(thread_flushes_subnormals):
    torch.set_flush_denormal(True)  # as an ONNX Runtime engine with flushing leaves the thread
    case = registry.get_case("feed_forward")
    _, params = build_module(case, ExportSettings(TINY))
    feeds = registry.make_inputs(case, TINY, example_shape(TINY), np.random.default_rng(0))
    engine = open_torch(case, TINY, params, feeds, "cpu", compiled=False)
    engine.run()
    engine.close()
    assert not thread_flushes_subnormals()

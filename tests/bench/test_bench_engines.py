"""The bench's engines: torch is timed with PyTorch's own floating-point defaults, whatever an
ONNX Runtime engine that flushes subnormal floats set on the calling thread before it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tconform import registry
from tconform.bench.engines import (
    engine_rows,
    engine_runtime,
    engine_variant,
    io_bound,
    open_engine,
)
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


class _Device:
    """A runtime as engine_rows sees it on a provider with device memory (CUDA)."""

    device_memory = True


@pytest.mark.parametrize("release", ["", "==1.20.1"])
def test_each_onnxruntime_graph_variant_gets_an_io_binding_row_on_a_device(release):
    engines = tuple(e + release for e in ("onnxruntime", "onnxruntime-fp16", "onnxruntime-fused"))
    rows = engine_rows((*engines, "torch"), ("cuda",), lambda *_, **__: _Device())
    assert [engine for engine, _ in rows] == [
        "onnxruntime" + release,
        "onnxruntime-iobinding" + release,
        "onnxruntime-fp16" + release,
        "onnxruntime-fp16-iobinding" + release,
        "onnxruntime-fused" + release,  # the optimizer's graph is opened apart, unbound
        "torch",
    ]
    bound = [engine for engine, _ in rows if io_bound(engine)]
    assert [engine_variant(e).dtype for e in bound] == ["float32", "float16"]
    assert {engine_runtime(e) for e in bound} == {"onnxruntime" + release}


def test_no_io_binding_row_without_device_memory():
    rows = engine_rows(("onnxruntime", "onnxruntime-fp16"), ("cpu",), make_runtime)
    assert [engine for engine, _ in rows] == ["onnxruntime", "onnxruntime-fp16"]


def test_the_default_shapes_fit_the_preset(tmp_path):
    """bench --preset tiny without --shape times 1x12 and 8x12 (the defaults' sequence cut to
    the preset's 12 positions), never a default shape that every row would skip."""
    from tconform.bench.run import DEFAULT_SHAPES, bench_settings

    def shapes(preset):
        settings = bench_settings(
            preset, ("norm",), (), ("onnxruntime",), "cpu", 1, {}, 0, 1, None, tmp_path
        )
        return settings.shapes

    assert shapes("tiny") == ((1, 12), (8, 12))
    assert shapes("base") == DEFAULT_SHAPES

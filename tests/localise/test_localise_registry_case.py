"""Localisation on the shipped cases: a fault injected into the exported whole model
(`transformer`) is named down to the sublayer of decoder layer 1, against the float64 reference
module built with tconform's own parameters."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tconform import registry
from tconform.config import PRESETS
from tconform.localise.registry_case import localise_case
from tconform.registry import Shape

pytestmark = pytest.mark.integration

TINY = PRESETS["tiny"]


@pytest.fixture(scope="module")
def transformer(built):
    """The tiny whole model exported by tconform (the session's export, read only), and inputs
    for it."""
    case = registry.get_case("transformer")
    inputs = registry.make_inputs(case, TINY, Shape(2, 7, 5), np.random.default_rng(1))
    return built["artifacts"] / "transformer" / "model.onnx", inputs


def _nodes_of(model: onnx.ModelProto, path: str) -> list[onnx.NodeProto]:
    """The nodes the dynamo exporter placed in module `path`, read from its metadata."""
    return [
        n
        for n in model.graph.node
        if any(p.key == "namespace" and f"/{path}: " in p.value for p in n.metadata_props)
    ]


def _with_epsilon(model: onnx.ModelProto, path: str) -> onnx.ModelProto:
    (norm,) = [n for n in _nodes_of(model, path) if n.op_type == "LayerNormalization"]
    next(a for a in norm.attribute if a.name == "epsilon").f = 0.1
    return model


def _with_scaled_weight(model: onnx.ModelProto, path: str) -> onnx.ModelProto:
    weights = {i.name: i for i in model.graph.initializer}
    matmul = next(n for n in _nodes_of(model, path) if n.op_type == "MatMul")
    weight = weights[next(name for name in matmul.input if name in weights)]
    array = numpy_helper.to_array(weight).copy()
    array[0] *= 1.5  # one row of the weight matrix
    weight.CopyFrom(numpy_helper.from_array(array, weight.name))
    return model


def test_the_clean_export_has_no_divergence(transformer):
    model_path, inputs = transformer
    loc = localise_case("transformer", model_path, inputs, TINY)
    assert loc.first is None, loc.verdict
    assert loc.scope_source == "dynamo metadata"
    assert len(loc.matched) > 50  # both stacks' layers, sublayers and projections


@pytest.mark.parametrize(
    ("fault", "path"),
    [
        (_with_epsilon, "decoder.layers.1.norm2"),
        (_with_scaled_weight, "decoder.layers.1.ffn.w1"),
        (_with_scaled_weight, "decoder.layers.1.cross_attn.w_v"),
    ],
)
def test_an_injected_fault_is_named_down_to_the_sublayer(transformer, tmp_path, fault, path):
    model_path, inputs = transformer
    bad = tmp_path / "model.onnx"
    onnx.save(fault(onnx.load(str(model_path)), path), str(bad))
    loc = localise_case("transformer", bad, inputs, TINY)
    assert loc.first is not None and loc.first.path == path, loc.verdict
    assert loc.first.inputs_status == "pass"
    earlier = loc.boundaries[: loc.boundaries.index(loc.first)]
    assert all(b.status != "fail" for b in earlier)  # everything before it was within tolerance

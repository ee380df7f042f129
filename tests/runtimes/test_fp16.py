"""float16 models end to end on the CPU provider, and the -1e9 fill that becomes -inf."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from tconform import registry
from tconform.config import PRESETS
from tconform.export import ExportSettings, example_shape, export_cases
from tconform.fp16 import (
    FLOAT16_MAX,
    find_overflowing_constants,
    float16_notes,
    ops_run_in_float32,
)
from tconform.results import Result
from tconform.runtimes.onnxruntime import OrtRuntime

pytestmark = pytest.mark.integration

DOC002 = PRESETS["tiny-doc002"]  # masked_fill(-1e9), std-based norm
CASE_NAMES = ("attention", "norm", "feed_forward")


@pytest.fixture(scope="module")
def fp16_artifacts(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fp16")
    cases = [registry.get_case(n) for n in CASE_NAMES]
    export_cases(cases, ExportSettings(DOC002, dtype="float16"), out, jobs=1)
    return out


def _fp16_feeds(case: registry.Case, rng_seed: int = 0) -> dict[str, np.ndarray]:
    arrays = registry.make_inputs(
        case, DOC002, example_shape(DOC002), np.random.default_rng(rng_seed)
    )
    return {
        s.name: arrays[s.name].astype(np.float16) if s.kind == "float" else arrays[s.name]
        for s in case.inputs(DOC002)
    }


@pytest.mark.parametrize("name", CASE_NAMES)
def test_fp16_model_runs_on_cpu_in_half_precision(name, fp16_artifacts):
    case = registry.get_case(name)
    session = OrtRuntime(ep="cpu").open(fp16_artifacts / name / "model.onnx")
    outputs = session.run(_fp16_feeds(case)).values()
    assert all(o.dtype == np.float16 for o in outputs)
    assert all(np.isfinite(o).all() for o in outputs)  # the example inputs mask no whole row
    assert set(session.placement) == {"cpu"}


def test_minus_1e9_fill_is_minus_inf_in_fp16(fp16_artifacts):
    found = find_overflowing_constants(fp16_artifacts / "attention" / "model.onnx")
    assert len(found) == 1
    assert found[0].value == -np.inf
    assert found[0].dtype == "float16"
    assert "Where" in found[0].consumers


def test_fp16_fully_masked_row_is_nan(fp16_artifacts):
    case = registry.get_case("attention")
    feeds = _fp16_feeds(case)
    feeds["mask"] = feeds["mask"].copy()
    feeds["mask"][0, 0, 0, :] = False  # mask every key of one query
    opened = OrtRuntime().open(fp16_artifacts / "attention" / "model.onnx")
    context, weights = opened.run(feeds).values()
    assert np.isnan(weights[0, 0, 0]).all()
    assert np.isnan(context[0, 0, 0]).all()  # NaN weights poison that query's context vector
    assert np.isfinite(weights[1]).all()


def test_norm_has_no_overflowing_constant(fp16_artifacts):
    assert find_overflowing_constants(fp16_artifacts / "norm" / "model.onnx") == []


def test_float32_constant_beyond_half_range_is_reported():
    from onnx import TensorProto, helper, numpy_helper

    fill = numpy_helper.from_array(np.array([-1e9], dtype=np.float32), "fill")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1])
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["x", "fill"], ["s"]),
            helper.make_node("Cast", ["s"], ["y"], to=TensorProto.FLOAT16),
        ],
        "g",
        [x],
        [y],
        [fill],
    )
    found = find_overflowing_constants(helper.make_model(graph))
    assert [(f.name, f.value, f.consumers) for f in found] == [("fill", -1e9, ("Add",))]
    assert FLOAT16_MAX == 65504.0


def test_a_float16_fill_at_its_lowest_read_by_where_is_not_noted_but_added_saturation_is():
    """transformers' float16 masks fill with -65504 through Where: finite, a fully masked row
    stays uniform, no note (it was one on every float16 decoder). The same value added to a
    score (a clamped bias, an additive mask) is still named."""
    from onnx import TensorProto, helper, numpy_helper

    def found_with(op: str) -> list:
        fill = numpy_helper.from_array(np.array([-65504.0], dtype=np.float16), "fill")
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT16, [1])
        node = helper.make_node(op, ["x", "fill"], ["y"])
        if op == "Where":
            x = helper.make_tensor_value_info("x", TensorProto.BOOL, [1])
            node = helper.make_node("Where", ["x", "fill", "fill"], ["y"])
        graph = helper.make_graph([node], "g", [x], [y], [fill])
        return find_overflowing_constants(helper.make_model(graph))

    assert found_with("Where") == []
    assert [(f.name, f.value, f.consumers) for f in found_with("Add")] == [
        ("fill", -65504.0, ("Add",))
    ]


def test_cpu_runs_fp16_matmul_in_float32(fp16_artifacts):
    # ORT 1.31's CPU provider has no float16 MatMul kernel: it inserts Casts instead of failing.
    in_float32 = ops_run_in_float32(fp16_artifacts / "feed_forward" / "model.onnx")
    assert in_float32.get("MatMul", 0) >= 2


def test_a_node_the_file_keeps_in_float32_is_not_said_to_be_run_so_for_want_of_a_kernel(tmp_path):
    """A float16 model whose converter kept a LayerNormalization in float32 between its own
    Casts: the CPU provider inserted nothing there, so only the float16 MatMul it widened is
    named."""
    from onnx import TensorProto, helper, numpy_helper

    nodes = [
        helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT, name="c0"),
        helper.make_node("LayerNormalization", ["x32", "g", "b"], ["n32"], name="kept"),
        helper.make_node("Cast", ["n32"], ["n16"], to=TensorProto.FLOAT16, name="c1"),
        helper.make_node("MatMul", ["n16", "w"], ["y"], name="product"),
    ]
    weights = [
        numpy_helper.from_array(np.ones(4, np.float32), "g"),
        numpy_helper.from_array(np.zeros(4, np.float32), "b"),
        numpy_helper.from_array(np.ones((4, 4), np.float16), "w"),
    ]
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT16, [2, 4]) for n in ("x", "y")]
    graph = helper.make_graph(nodes, "g", io[:1], io[1:], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9)
    onnx.save(model, tmp_path / "kept.onnx")
    assert ops_run_in_float32(tmp_path / "kept.onnx") == {"MatMul": 1}
    # A converter that kept the node can leave value_info saying float16 for its float32
    # weights (onnxruntime.transformers.float16 with a node_block_list did): read past it.
    stale = helper.make_tensor_value_info("g", TensorProto.FLOAT16, [4])
    model.graph.value_info.append(stale)
    onnx.save(model, tmp_path / "stale.onnx")
    assert ops_run_in_float32(tmp_path / "stale.onnx") == {"MatMul": 1}


def test_verify_notes_name_the_minus_inf_fill_and_the_ops_run_in_float32(fp16_artifacts):
    notes = float16_notes(fp16_artifacts / "attention" / "model.onnx", "cpu")
    assert any("-inf" in n and "Where" in n and "NaN" in n for n in notes)
    assert any("float32" in n and "MatMul" in n for n in notes)
    # The same model on another provider: only the fill, since the Cast insertion is the CPU's.
    assert len(float16_notes(fp16_artifacts / "attention" / "model.onnx", "cuda")) == 1


def test_every_float16_result_carries_the_notes(fp16_artifacts):
    """The execution layer stamps them on every result of a float16 model (the function above
    alone would not put them in a report)."""
    from tconform.execution import Subject, open_subject
    from tconform.models import given_file

    model = given_file(fp16_artifacts / "attention" / "model.onnx")
    with open_subject(OrtRuntime(), Subject(model)) as opened:
        assert opened.precision == "float16"
        row = opened.stamp(Result.about("attention", "attention"))
    assert any("-inf" in n and "NaN" in n for n in row.notes)
    assert any("ran them in float32" in n for n in row.notes)

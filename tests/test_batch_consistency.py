"""Batch consistency in the execution layer: a batch run whole and row by row, each row judged
against its run alone; and a shape the model fixed, a skip naming the dimension."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tconform.compare import Tolerance, judge_outputs
from tconform.execution import BatchRows, Subject, execute
from tconform.golden import InputSet
from tconform.models import given_file
from tconform.results import Result
from tconform.runtimes.onnxruntime import OrtRuntime

pytestmark = pytest.mark.unit

JUDGE = judge_outputs(lambda precision, output: Tolerance(1e-6, 1e-6, "test"))


def _model(tmp_path, nodes, batch="batch", name="model.onnx") -> Subject:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 3])
    graph = helper.make_graph(nodes, "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.save(model, tmp_path / name)
    return Subject(given_file(tmp_path / name))


def _run(subject, sets):
    return execute(OrtRuntime(), subject, sets, JUDGE, Result.about("m", "m"))


def test_rows_that_do_not_depend_on_each_other_are_consistent(tmp_path):
    subject = _model(tmp_path, [helper.make_node("Relu", ["x"], ["y"])])
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    (result,) = _run(subject, [BatchRows("batch-consistency", {"x": x}, {"x": 0}, 4)])
    assert result.status == "pass" and result.outputs[0].compared == 12


def test_an_output_that_pairs_the_rows_is_not_judged_by_rows(tmp_path):
    """A (batch, batch) output (a similarity, CLIP's logits_per_image) mixes rows by design:
    rebuilt from single rows it has another shape, which failed healthy models; it is left
    out, and the output beside it that splits by row is judged."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3]),
        helper.make_tensor_value_info("gram", TensorProto.FLOAT, ["batch", "batch"]),
    ]
    nodes = [
        helper.make_node("Relu", ["x"], ["y"]),
        helper.make_node("Transpose", ["x"], ["xt"]),
        helper.make_node("MatMul", ["x", "xt"], ["gram"]),
    ]
    graph = helper.make_graph(nodes, "g", [x], outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
    onnx.save(model, tmp_path / "gram.onnx")
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    batched = BatchRows("batch-consistency", {"x": x}, {"x": 0}, 4)
    (result,) = _run(Subject(given_file(tmp_path / "gram.onnx")), [batched])
    assert result.status == "pass", result.message
    assert [o.name for o in result.outputs] == ["y"]


@pytest.mark.parametrize(
    ("whole", "part", "axis"),
    [
        ((4, 3), (1, 3), 0),
        ((5, 4, 2), (5, 1, 2), 1),
        ((4, 4), (1, 1), None),
        ((4, 3), (2, 3), None),
    ],
)
def test_an_outputs_row_axis_is_the_one_axis_that_holds_the_rows(whole, part, axis):
    from tconform.execution import row_axis

    assert row_axis(whole, part, 4, 1) == axis


def test_a_sequence_first_output_is_judged_along_its_batch_axis(tmp_path):
    """x and y are (sequence, batch, features): a row alone is (sequence, 1, features), and
    the whole run's rows are its axis 1; the model that mixes them there fails."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, "batch", 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, "batch", 2])
    mixing = [
        helper.make_node("Constant", [], ["axes"], value_ints=[1]),
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["y"]),
    ]
    data = np.random.default_rng(0).standard_normal((3, 4, 2)).astype(np.float32)
    for name, nodes, status in [("plain", [helper.make_node("Relu", ["x"], ["y"])], "pass"),
                                ("mixing", mixing, "fail")]:  # fmt: skip
        graph = helper.make_graph(nodes, "g", [x], [y])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=8)
        onnx.save(model, tmp_path / f"{name}.onnx")
        subject = Subject(given_file(tmp_path / f"{name}.onnx"))
        (result,) = _run(subject, [BatchRows("batch-consistency", {"x": data}, {"x": 1}, 4)])
        assert result.status == status and result.outputs[0].compared == 24, result.message


def test_a_model_that_mixes_the_rows_of_a_batch_fails_it(tmp_path):
    # y = x - mean over the batch: row i alone is zero, in a batch it is not
    nodes = [
        helper.make_node("Constant", [], ["axes"], value_ints=[0]),
        helper.make_node("ReduceMean", ["x", "axes"], ["m"], keepdims=1),
        helper.make_node("Sub", ["x", "m"], ["y"]),
    ]
    subject = _model(tmp_path, nodes)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    (result,) = _run(subject, [BatchRows("batch-consistency", {"x": x}, {"x": 0}, 4)])
    assert result.status == "fail" and result.input_set == "batch-consistency"


def test_a_dimension_the_model_fixed_is_a_skip_naming_it_and_the_way_on(tmp_path):
    """tconform's export: the option that frees it, or where its exporter could not, the way
    on the export said; a file made elsewhere: a new export."""
    from dataclasses import replace

    subject = _model(tmp_path, [helper.make_node("Relu", ["x"], ["y"])], batch=2)
    x = np.zeros((3, 3), dtype=np.float32)
    exported = replace(subject.onnx, provenance=replace(subject.onnx.provenance, origin="exported"))
    ways = [
        (subject.onnx, "export the file again with that axis dynamic"),
        (replace(exported, fixed_way_on=""), "--dynamic x=0"),
        (replace(exported, fixed_way_on="dynamo could not"), "static (dynamo could not)"),
    ]
    for model, way in ways:
        (result,) = _run(Subject(model), [InputSet("batch-3", {"x": x}, {"y": x})])
        assert result.status == "skip"
        assert "fixes input 'x' axis 0 at 2" in result.message
        assert way in result.message, result.message

"""Precision plans on the zoo (issue 29): the massive-activation models' plain float16 and int8
conversions fail, and the models made with their plans pass, each judged by its precision's
row; plan.json names the modules kept and why, and the planned models keep exactly those in
float32 (where a massive activation rides the residual stream: only the nodes that make and read
it, so that the model still computes in float16)."""

from __future__ import annotations

import json

import onnx
import pytest

import tconform
from tconform.request import Axes
from tests.zoo.models import massive_activation, massive_residual

pytestmark = [pytest.mark.zoo, pytest.mark.axes]  # its own tier: -m axes

DTYPES = ("float16", "float16-planned", "int8", "int8-planned")


def _checked(factory, dtypes: tuple[str, ...], out_dir):
    """`check --matrix --dtype DTYPES` of the factory's model on ONNX Runtime: its results by
    dtype."""
    module, inputs = factory()
    report = tconform.check(
        module,
        inputs,
        matrix=Axes(matrix=True, exporters=("auto",), dtypes=dtypes),
        runtimes=("onnxruntime",),
        shapes=False,  # the plans are made on the example; `check` judges every input set
        localise=False,  # the plans localise on their own
        out_dir=out_dir,
    )
    results = {r.cell.removeprefix("auto-opset18-").removesuffix("-all"): r for r in report.results}
    assert set(results) == set(dtypes)
    return report, results


def test_the_plans_pass_where_the_plain_conversions_fail(tmp_path):
    report, results = _checked(massive_activation, DTYPES, tmp_path)
    for dtype, expected in zip(DTYPES, ("fail", "pass", "fail", "pass"), strict=True):
        result = results[dtype]
        assert result.status == expected, (dtype, result.message)
        assert result.precision == dtype.removesuffix("-planned")  # its precision's row
    assert report.exit_code == 1  # the plain conversions' failures stand beside the plans

    cells = tmp_path / "matrix"
    float16 = json.loads((cells / "auto-opset18-float16-planned" / "plan.json").read_text())
    kept = {k["module"]: k for k in float16["kept"]}
    assert set(kept) == {"blocks.0.mlp.up", "blocks.0.mlp.act", "blocks.0.mlp.down"}
    assert all(k["why"] == "range" and "1e+05" in k["detail"] for k in kept.values())
    assert [r["outputs"] for r in float16["rounds"]] == ["fail", "pass"]
    int8 = json.loads((cells / "auto-opset18-int8-planned" / "plan.json").read_text())
    (down,) = int8["kept"]
    assert down["module"] == "blocks.0.mlp.down" and down["why"] == "isolated"
    assert "SQNR" in down["detail"] and [r["outputs"] for r in int8["rounds"]] == ["fail", "pass"]
    planned = results["int8-planned"].notes[0]
    assert planned.startswith("precision plan (plan.json): keeps blocks.0.mlp.down in float32")

    # The lists are the converters' own arguments, and the models keep those nodes in float32:
    # the massive unit's bias stays float32 (the plain conversion clamps it to float16's 65504),
    # and the down projection stays a float MatMul beside the other MatMulIntegers.
    assert float16["arguments"]["node_block_list"] == float16_nodes(kept)
    assert int8["arguments"]["nodes_to_exclude"] == down["nodes"]

    def model(dtype: str) -> onnx.ModelProto:
        return onnx.load(str(cells / f"auto-opset18-{dtype}" / "model.onnx"))

    def bias_type(m: onnx.ModelProto) -> int:
        return next(t.data_type for t in m.graph.initializer if t.name == "blocks.0.mlp.up.bias")

    assert bias_type(model("float16")) == onnx.TensorProto.FLOAT16
    assert bias_type(model("float16-planned")) == onnx.TensorProto.FLOAT
    ops = {n.name: n.op_type for n in model("int8-planned").graph.node}
    excluded = [n for n in down["nodes"] if ops.get(n) == "MatMul"]
    assert excluded and "MatMulInteger" in ops.values()
    record = json.loads((cells / "auto-opset18-int8-planned" / "check.json").read_text())
    assert set(record["sha256"]) == {"model.onnx", "plan.json"}  # replaced by the next run


def float16_nodes(kept: dict[str, dict]) -> list[str]:
    return list(dict.fromkeys(n for k in kept.values() for n in k["nodes"]))


def test_a_massive_residual_channel_keeps_the_nodes_on_it_and_not_the_layers_between(tmp_path):
    _, results = _checked(massive_residual, ("float16", "float16-planned"), tmp_path)
    plain, planned = results["float16"], results["float16-planned"]
    assert plain.status == "fail" and plain.outputs[0].kind == "nonfinite"  # NaN logits
    assert planned.status == "pass" and planned.precision == "float16", planned.message
    plan = json.loads((tmp_path / "matrix/auto-opset18-float16-planned/plan.json").read_text())
    kept = {(k["module"], k["own_ops"]) for k in plan["kept"]}
    assert kept == {
        ("blocks.0.mlp.down", False),  # makes the channel
        ("blocks.0", True),  # its residual Add
        ("blocks.1.norm", False),  # reads it
        ("blocks.1", True),
        ("norm", False),
    }
    assert plan["kept_nodes"] <= plan["total_nodes"] // 4  # the feed-forwards stay float16

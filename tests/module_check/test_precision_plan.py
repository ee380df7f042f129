"""Precision plans' parts: which tensors float16 cannot hold, which nodes a module's plan keeps,
and the converters' models with those nodes kept (float32 all the way between two kept nodes,
loadable by ONNX Runtime). The plans end to end: tests/zoo/test_precision_plans.py."""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from tconform.check_folder import record_own_files, require_own_export_folder
from tconform.compare import OutputComparison, tolerance_for
from tconform.errors import Refused
from tconform.localise.capture import Call, ModuleTree
from tconform.localise.judge import Boundary
from tconform.localise.scopes import Graph
from tconform.module_check import precision_plan
from tconform.module_check.convert import convert
from tconform.module_check.float64_copy import Float64Copy
from tconform.module_check.precision_plan import (
    MAX_ROUNDS,
    KeptModule,
    make_plan,
    module_nodes,
    out_of_float16,
)
from tconform.runtimes import make_runtime

pytestmark = pytest.mark.unit


def _call(path: str, inputs: list[np.ndarray], outputs: list[np.ndarray]) -> Call:
    return Call(path, 0, 1, "pkg.M", inputs, outputs)


def test_values_beyond_float16_are_found_at_the_module_that_makes_them_and_its_readers():
    big = np.array([1.0, -2.0, 1.2e5])
    calls = [
        _call("mlp.up", [np.ones(3)], [big]),
        _call("mlp.down", [big], [np.ones(3)]),
        _call("mlp", [np.ones(3)], [np.ones(3)]),
    ]
    found = out_of_float16(calls)
    assert set(found) == {"mlp.up", "mlp.down"}
    assert found["mlp.up"].startswith("an output reaches 1.2e+05, beyond float16's largest 65504")
    assert found["mlp.down"].startswith("an input reaches 1.2e+05")


@pytest.mark.parametrize(
    "fill", [-1e9, float(np.finfo(np.float32).min), float(np.finfo(np.float64).min), -np.inf]
)
def test_mask_fills_are_not_activations_out_of_range(fill):
    """The converter clamps a mask fill to float16's range (or keeps -inf), where it still
    masks: an attention module reading one is not kept for it."""
    scores = np.array([[0.5, fill], [1.5, 2.0]])
    assert out_of_float16([_call("attn", [scores], [np.ones(2)])]) == {}


def test_a_tensor_wholly_below_float16s_normal_range_is_found_a_few_tiny_values_are_not():
    tiny = np.array([3e-6, -1e-6, 0.0])
    softmax = np.array([0.999, 1e-9, 1e-30])  # underflows here and there: harmless
    found = out_of_float16([_call("scale", [np.ones(3)], [tiny]), _call("soft", [], [softmax])])
    assert list(found) == ["scale"]
    assert "wholly below float16's smallest normal" in found["scale"]


def test_a_module_kept_whole_keeps_its_submodules_and_one_kept_for_its_own_ops_does_not():
    def kept(path: str, own_ops: bool) -> KeptModule:
        return KeptModule(path, "pkg.M", "range", "", 1, own_ops, ["n"])

    whole, own = kept("blocks.0", False), kept("blocks.0", True)
    assert whole.keeps("blocks.0.mlp", own_ops=False) and whole.keeps("blocks.0", own_ops=True)
    assert not whole.keeps("blocks.01", own_ops=False)
    assert own.keeps("blocks.0", own_ops=True) and not own.keeps("blocks.0", own_ops=False)
    assert not own.keeps("blocks.0.mlp", own_ops=True)
    assert kept("", False).keeps("blocks.0", own_ops=False)  # the module itself, whole
    assert not kept("", True).keeps("blocks.0", own_ops=True)


def _scoped(op: str, inputs: list[str], output: str, *modules: str) -> onnx.NodeProto:
    """A node named after its output, in the dynamo exporter's scope record for `modules`."""
    node = helper.make_node(op, inputs, [output], name=f"node_{output}")
    scope = "/".join([": pkg.Model", *(f"{m}: pkg.M" for m in modules), f"{op}: aten"])
    helper.set_metadata_props(node, {"namespace": scope})
    return node


def test_a_modules_nodes_are_every_node_of_it_or_its_own_ops():
    nodes = [
        _scoped("MatMul", ["x", "w"], "h", "mlp", "mlp.up"),
        _scoped("Relu", ["h"], "r", "mlp"),
        _scoped("Add", ["r", "x"], "y"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = Graph.read(helper.make_model(helper.make_graph(nodes, "g", [x], [y])), set())
    assert module_nodes(graph, "mlp", own_ops=False) == ["node_h", "node_r"]
    assert module_nodes(graph, "mlp", own_ops=True) == ["node_r"]
    assert module_nodes(graph, "mlp.up", own_ops=True) == ["node_h"]
    assert module_nodes(graph, "", own_ops=True) == ["node_y"]
    assert module_nodes(graph, "", own_ops=False) == ["node_h", "node_r", "node_y"]
    assert module_nodes(graph, "head", own_ops=False) == []


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    """At an IR version the installed ONNX Runtime reads (onnx's default may be newer)."""
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


def _chain(path) -> None:
    """y = x * 1e5 * 1e-5 twice, added: 2x. The 1e5 lies beyond float16 (the converter clamps
    it to 65504 where a float16 node reads it); its product B is read by two nodes, C and D.
    Nodes named by letter."""
    constants = [
        numpy_helper.from_array(np.array(v, np.float32), name)
        for name, v in (("huge", 1e5), ("small", 1e-5))
    ]
    nodes = [
        helper.make_node("Mul", ["x", "huge"], ["big"], name="B"),
        helper.make_node("Mul", ["big", "small"], ["c"], name="C"),
        helper.make_node("Mul", ["big", "small"], ["d"], name="D"),
        helper.make_node("Add", ["c", "d"], ["y"], name="E"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])
    graph = helper.make_graph(nodes, "g", [x], [y], constants)
    onnx.save(_model(graph), str(path))


def _run(path, x: np.ndarray) -> np.ndarray:
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_float16_keeps_a_value_in_float32_between_two_kept_nodes(tmp_path):
    """The converter alone rounds the kept B's output through float16 before the kept C and D
    (a Cast pair), and casts it once for each of them under one name (a model ONNX Runtime
    refuses to load); kept, it stays float32 from B to C and D, and so does B's constant."""
    _chain(tmp_path / "base.onnx")
    x = np.array([1.0, -0.5, 0.25], np.float32)
    convert(tmp_path / "base.onnx", "float16", tmp_path / "plain.onnx")
    assert not np.allclose(_run(tmp_path / "plain.onnx", x), 2 * x, rtol=0.1)  # 1e5 -> 65504
    convert(tmp_path / "base.onnx", "float16", tmp_path / "kept.onnx", ["B", "C", "D"])
    np.testing.assert_allclose(_run(tmp_path / "kept.onnx", x), 2 * x, rtol=2e-3)
    model = onnx.load(str(tmp_path / "kept.onnx"))
    onnx.checker.check_model(model)  # topologically sorted, one producer per tensor
    kept = {n.name: n for n in model.graph.node}
    assert kept["C"].input[0] == kept["D"].input[0] == kept["B"].output[0]  # no Cast between
    float32 = {t.name for t in model.graph.initializer if t.data_type == TensorProto.FLOAT}
    assert "huge" in float32
    # C's and D's outputs to float16 for E, E's back to float32 for y: no other Cast
    assert [n.op_type for n in model.graph.node].count("Cast") == 3


def test_int8_leaves_the_excluded_matmul_in_float32(tmp_path):
    rng = np.random.default_rng(0)
    weights = [
        numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), name)
        for name in ("w1", "w2")
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="first"),
        helper.make_node("MatMul", ["h", "w2"], ["y"], name="second"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 16])
    graph = helper.make_graph(nodes, "g", [x], [y], weights)
    onnx.save(_model(graph), tmp_path / "b")
    convert(tmp_path / "b", "int8", tmp_path / "q.onnx", ["second"])
    ops = [n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node]
    assert ops.count("MatMulInteger") == 1 and ops.count("MatMul") == 1


def test_a_plan_json_is_replaced_only_where_check_wrote_it(tmp_path):
    """plan.json is one of check's own files: recorded in check.json, replaced by the next run;
    one it did not write is never replaced."""
    (tmp_path / "model.onnx").write_bytes(b"written by check")
    (tmp_path / "plan.json").write_text("{}")
    record_own_files(tmp_path)
    require_own_export_folder(tmp_path)
    (tmp_path / "plan.json").write_text('{"edited": true}')
    with pytest.raises(Refused, match=r"plan\.json: not written by tconform check"):
        require_own_export_folder(tmp_path)


# --- the rounds: each converted model localised again, modules kept until its outputs pass ----


def _comparison(share: float) -> OutputComparison:
    status = "fail" if share > 1 else "pass"
    return OutputComparison("out", [2], status, "ok", 0.4, 0.4, share, tolerance_used=share)


def _boundary(path: str, isolated: float | None = None, outputs: float = 0.1) -> Boundary:
    """A module call as localisation judges it: its outputs in the run, and (where it was cut
    out) its isolated run, each as a share of the row."""
    b = Boundary(path, 0, 1, "pkg.M", "pass", "pass", outputs=[_comparison(outputs)])
    b.status = b.outputs[0].status
    if isolated is not None:
        b.isolated = [_comparison(isolated)]
        b.isolated_status = b.isolated[0].status
    return b


def _planning(tmp_path, monkeypatch, rounds: list[list[Boundary]]):
    """make_plan (int8) on a three-module graph, each round's localisation `rounds[n]` (the
    whole module first: its outputs are the model's), the conversion a copy of the graph."""
    nodes = [
        _scoped("MatMul", ["x", "w"], "h", "a", "a.x"),
        _scoped("Relu", ["h"], "r", "a"),
        _scoped("Neg", ["r"], "y", "b"),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    onnx.save(_model(helper.make_graph(nodes, "g", [x], [y])), str(tmp_path / "base.onnx"))
    scripted = iter(rounds)
    monkeypatch.setattr(
        precision_plan, "convert", lambda base, _, target, keep: shutil.copy(base, target)
    )
    monkeypatch.setattr(
        precision_plan, "localise", lambda *_, **__: SimpleNamespace(boundaries=next(scripted))
    )
    tree = ModuleTree({"": "pkg.Model", "a": "pkg.A", "a.x": "pkg.X", "b": "pkg.B"})
    reference = Float64Copy({}, "float64", tree, None, capture=list)  # no calls: scripted
    (tmp_path / "cell").mkdir()
    plan = make_plan(
        tmp_path / "base.onnx", "int8", reference, {}, make_runtime("onnxruntime"),
        tolerance_for("int8", "model"), tmp_path / "cell",
    )  # fmt: skip
    written = json.loads((tmp_path / "cell" / "plan.json").read_text())
    return plan, written


def test_a_planned_model_that_still_fails_keeps_more_until_it_passes(tmp_path, monkeypatch):
    """Round 0 (the plain conversion): a.x fails alone, a around it with it: a.x is kept.
    Round 1: a fails on its own ops: a is kept (a.x with it). Round 2: nothing fails alone,
    the outputs still do: the largest share, b. Round 3 passes."""
    plan, written = _planning(
        tmp_path,
        monkeypatch,
        [
            [
                _boundary("", outputs=3),
                _boundary("a.x", 2.0),
                _boundary("a", 1.5),
                _boundary("b", 0.2),
            ],
            [
                _boundary("", outputs=2),
                _boundary("a.x", 0.01),
                _boundary("a", 1.2),
                _boundary("b", 0.3),
            ],
            [_boundary("", outputs=1.5), _boundary("a", 0.02), _boundary("b", 0.6)],
            [_boundary("", outputs=0.5)],
        ],
    )
    assert [(k.module, k.why, k.round) for k in plan.kept] == [
        ("a", "isolated", 2),
        ("b", "largest share", 3),
    ]
    assert plan.nodes == ["node_h", "node_r", "node_y"]
    assert [r["outputs"] for r in written["rounds"]] == ["fail", "fail", "fail", "pass"]
    assert written["arguments"]["nodes_to_exclude"] == plan.nodes
    assert written["passes_on_input_set"] and "60.0% of the row" in plan.kept[1].detail


def test_the_rounds_are_bounded_and_a_plan_that_never_passes_says_so(tmp_path, monkeypatch):
    failing = [[_boundary("", outputs=2), _boundary(p, 3.0)] for p in ("a.x", "a", "b", "b")]
    plan, written = _planning(tmp_path, monkeypatch, failing)
    assert len(written["rounds"]) == MAX_ROUNDS + 1 and not written["passes_on_input_set"]
    assert "fail the int8 row" in plan.summary


def test_a_plain_conversion_that_passes_with_no_module_out_keeps_nothing(tmp_path, monkeypatch):
    plan, written = _planning(
        tmp_path, monkeypatch, [[_boundary("", outputs=0.3), _boundary("a", 0.5)]]
    )
    assert plan.kept == [] and written["arguments"]["nodes_to_exclude"] == []
    assert [r["round"] for r in written["rounds"]] == [0] and written["passes_on_input_set"]
    assert (tmp_path / "cell" / "model.onnx").read_bytes() == (tmp_path / "base.onnx").read_bytes()

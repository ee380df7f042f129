"""The quantisers: restore_scopes gives their nodes the module scope their consumers share, so
that localisation places a quantised Linear's MatMulInteger inside the Linear; ONNX's own
Attention survives int8 quantisation."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tconform.export.quantize import quantize_int8, restore_scopes
from tconform.localise.scopes import dynamo_scope, node_namespace

pytestmark = pytest.mark.unit

ROOT = ": pkg.Model"
ATTENTION = f"{ROOT}/attn: pkg.Attention"


def _node(op: str, inputs: list[str], outputs: list[str], namespace: str | None = None):
    node = helper.make_node(op, inputs, outputs, name=f"{op}_{outputs[0]}")
    if namespace is not None:
        helper.set_metadata_props(node, {"namespace": namespace})
    return node


def test_quantiser_nodes_take_the_scope_their_consumers_share():
    nodes = [
        _node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),  # shared by both projections
        _node("MatMulInteger", ["xq", "wq"], ["q_int"]),
        _node("Mul", ["q_int", "xs"], ["q_scaled"]),
        _node("Add", ["q_scaled", "bq"], ["q"], f"{ATTENTION}/attn.w_q: nn.Linear/add: aten.add"),
        _node("MatMulInteger", ["xq", "wk"], ["k_int"]),
        _node("Add", ["k_int", "bk"], ["k"], f"{ATTENTION}/attn.w_k: nn.Linear/add: aten.add"),
        _node("Cast", ["k"], ["out"]),  # feeds only the graph's output: no scope to give it
    ]
    graph = helper.make_graph(nodes, "g", [], [])
    restore_scopes(graph)
    scope = {node.output[0]: dynamo_scope(node_namespace(node)) for node in graph.node}
    assert scope["xq"] == ("", "attn")  # both projections' common module
    assert scope["q_int"] == scope["q_scaled"] == ("", "attn", "attn.w_q")
    assert scope["k_int"] == ("", "attn", "attn.w_k")
    assert node_namespace(graph.node[-1]) is None
    # A node that had a namespace keeps it.
    assert node_namespace(graph.node[3]) == f"{ATTENTION}/attn.w_q: nn.Linear/add: aten.add"


def test_a_linear_without_a_bias_keeps_its_scope_through_the_tensor_its_matmul_made():
    """Llama's and T5's projections have no bias: no node of the Linear's survives the
    quantiser, and its consumer (the residual Add) alone would place the chain in the layer
    around it. The rescale Mul makes the MatMul's output, so it takes the MatMul's scope in the
    source graph, and the chain before it the Mul's."""
    o_proj = f"{ATTENTION}/attn.o_proj: nn.Linear"
    residual = f"{ROOT}/add: aten.add"
    source = helper.make_graph(
        [
            _node("MatMul", ["ctx", "w"], ["o"], f"{o_proj}/linear: aten.linear"),
            _node("Add", ["o", "x"], ["y"], residual),
        ],
        "source",
        [],
        [],
    )

    def quantised():
        return helper.make_graph(
            [
                _node("DynamicQuantizeLinear", ["ctx"], ["cq", "cs", "cz"]),
                _node("MatMulInteger", ["cq", "wq"], ["o_int"]),
                _node("Mul", ["o_int", "cs"], ["o"]),  # makes the MatMul's output
                _node("Add", ["o", "x"], ["y"], residual),
            ],
            "g",
            [],
            [],
        )

    def scopes(graph):
        return {node.output[0]: dynamo_scope(node_namespace(node)) for node in graph.node}

    restored = quantised()
    restore_scopes(restored, source)
    assert {scopes(restored)[n] for n in ("cq", "o_int", "o")} == {("", "attn", "attn.o_proj")}
    without_source = quantised()
    restore_scopes(without_source)
    assert scopes(without_source)["o"] == ("",)  # the residual's scope: the Linear lost


def test_int8_leaves_onnx_attention_float_and_quantises_its_projection(tmp_path):
    """quantize_dynamic takes ONNX's Attention (opset 23, the sdpa export) for ONNX Runtime's
    contrib op and writes a QAttention that does not load: it must stay as it was."""
    shape = [1, 2, 4, 8]  # batch, heads, sequence, head width
    weight = np.random.default_rng(0).standard_normal((8, 8)).astype(np.float32)
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["q"], name="proj"),
        helper.make_node("Attention", ["q", "x", "x"], ["y"], name="sdpa", is_causal=1),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        [numpy_helper.from_array(weight, "w")],
    )
    source, target = tmp_path / "f32.onnx", tmp_path / "int8.onnx"
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)], ir_version=10)
    onnx.save(model, source)
    quantize_int8(source, target)
    ops = {(n.op_type, n.domain) for n in onnx.load(target).graph.node}
    assert ("Attention", "") in ops and ("QAttention", "com.microsoft") not in ops
    assert any(op in ("MatMulInteger", "DynamicQuantizeMatMul") for op, _ in ops)
    import onnxruntime

    session = onnxruntime.InferenceSession(target, providers=["CPUExecutionProvider"])
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    (y,) = session.run(None, {"x": x})
    assert y.shape == tuple(shape) and np.isfinite(y).all()


def test_int8_does_not_trip_on_shapes_the_exporter_recorded_for_its_weights(tmp_path):
    """The dynamo exporter records each weight's shape; quantize_dynamic turns a Gemm with
    transB into a MatMul of the transposed weight, and ONNX's shape inference then found the
    recorded shape contradicted (a linear classifier head, Electra's): the quantiser failed,
    and with it a whole check --matrix run."""
    weight = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w"], ["y"], name="head", transB=1)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(weight, "w")],
        value_info=[helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 4])],
    )
    source, target = tmp_path / "f32.onnx", tmp_path / "int8.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), source)
    before = source.read_bytes()
    quantize_int8(source, target)
    assert source.read_bytes() == before  # the source is only read
    ops = {n.op_type for n in onnx.load(target).graph.node}
    assert ops & {"MatMulInteger", "DynamicQuantizeMatMul"}, ops

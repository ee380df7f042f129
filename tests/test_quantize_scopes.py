"""restore_scopes: the quantiser's nodes take the module scope their consumers share, so that
localisation places a quantised Linear's MatMulInteger inside the Linear."""

import pytest
from onnx import helper

from tconform.export.quantize import restore_scopes
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

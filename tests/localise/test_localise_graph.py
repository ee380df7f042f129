"""Localisation on hand-built ONNX graphs whose node scopes mirror a small PyTorch module, so
that the verdict is known in advance: a fault in a submodule names that submodule, a fault in
the parent's own op names the parent, and the model file is never touched."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
from onnx import TensorProto

from tconform.compare import Tolerance
from tconform.files import sha256_file
from tconform.localise import ModuleTree, capture_calls, localise, render
from tconform.localise.judge import pair_tensors
from tconform.localise.scopes import Graph, dynamo_scope, torchscript_scope
from tconform.models import derived_file
from tconform.runtimes import make_runtime
from tests.localise.graphs import Chain, save_model, scoped_node

pytestmark = pytest.mark.unit

TOL = Tolerance(1e-5, 1e-5, "test")


def _model(path, style="dynamo", two=2.0, one=1.0, three=3.0):
    consts = {"two": two, "one": one, "three": three, "unit": 1.0}
    nodes = [
        scoped_node("Mul", ["x", "two"], ["t"], ["a"], style),
        scoped_node("Identity", ["t"], ["t2"], None, style),  # no scope: inferred to sit in a
        scoped_node("Mul", ["t2", "unit"], ["h1"], ["a"], style),
        scoped_node("Add", ["h1", "one"], ["h2"], [], style),  # the parent's own op
        scoped_node("Mul", ["h2", "three"], ["y"], ["b"], style),
    ]
    initializers = {k: np.array(v, np.float32) for k, v in consts.items()}
    return save_model(path, nodes, {"x": (TensorProto.FLOAT, [2, 3])}, {"y": [2, 3]}, initializers)


def _localise(path):
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    net = Chain().double()
    calls, _ = capture_calls(net, (torch.from_numpy(x).double(),), {})
    model = derived_file(path)
    return localise(model, calls, ModuleTree.of(net), {"x": x}, make_runtime("onnxruntime"), TOL)


def test_scopes_from_dynamo_metadata_and_torchscript_names():
    namespace = ": m.Net/layers.0: m.Block/layers.0.ln: torch.nn.LayerNorm/layer_norm: aten.x"
    assert dynamo_scope(namespace) == ("", "layers.0", "layers.0.ln")
    assert dynamo_scope("_empty_nn_module_stack_from_metadata_hook: x/sym: aten.y") is None
    modules = {"", "layers", "layers.0", "layers.0.ln", "act"}
    found = torchscript_scope("/layers.0/ln/LayerNormalization", modules)
    assert found == (("", "layers.0", "layers.0.ln"), (0, 0, 0))
    # under a container TorchScript repeats the container's name before the index
    found = torchscript_scope("/layers/layers.0/ln/LayerNormalization", modules)
    assert found == (("", "layers", "layers.0", "layers.0.ln"), (0, 0, 0, 0))
    # a second call of one module is the module's name numbered
    assert torchscript_scope("/act_1/Relu", modules) == (("", "act"), (0, 1))
    assert torchscript_scope("/Add", modules) == (("",), (0,))
    # a module called by its grandparent, past one never called (OPTForCausalLM calls
    # self.model.decoder): the one deeper module of that name, never a guess among several
    modules = {"", "model", "model.model", "model.model.decoder", "model.model.decoder.fc"}
    found = torchscript_scope("/model/decoder/fc/Gemm", modules)
    assert found == (("", "model", "model.model.decoder", "model.model.decoder.fc"), (0,) * 4)
    found = torchscript_scope("/model/fc/Gemm", {*modules, "model.head", "model.head.fc"})
    assert found == (("", "model"), (0, 0))
    assert torchscript_scope("Identity_3", modules) is None


def test_regions_and_boundary_tensors(tmp_path):
    graph = Graph.read(onnx.load(str(_model(tmp_path / "m.onnx"))), {"", "a", "b"})
    assert graph.scope_source == "dynamo metadata"
    region = graph.region("a")
    assert len(region) == 3  # the unscoped Identity joins the scope around it
    assert graph.leaving(region) == ["h1"]
    assert graph.entering(region) == ["x"]  # initializers are not inputs
    assert graph.op_types(graph.region("")) == {"Mul": 3, "Identity": 1, "Add": 1}
    assert graph.op_types(graph.region(""), "") == {"Add": 1}


def test_a_tensor_made_from_a_shape_is_no_output_of_a_module_that_computes_values(tmp_path):
    """A GRU's initial state of zeros, made in its scope at the batch's shape and reused by the
    next LSTM, has the shape of the GRU's h_n: paired with it, an unmodified model showed the
    GRU outside tolerance at 71430x. A region that makes only such tensors (a rotary table
    from positions made of the sequence's length) keeps them."""
    nodes = [
        scoped_node("Mul", ["x", "two"], ["y"], ["gru"]),
        scoped_node("Shape", ["x"], ["s"], ["gru"]),
        scoped_node("ConstantOfShape", ["s"], ["h0"], ["gru"]),
        scoped_node("Add", ["y", "h0"], ["z"], ["lstm"]),
        scoped_node("Shape", ["x"], ["n"], ["rotary"]),
        scoped_node("ConstantOfShape", ["n"], ["table"], ["rotary"], value=_one_float()),
        scoped_node("Mul", ["z", "table"], ["out"], []),
    ]
    weights = {"two": np.array(2.0, np.float32)}
    path = save_model(
        tmp_path / "m.onnx", nodes, {"x": (TensorProto.FLOAT, [2, 3])}, {"out": [2, 3]}, weights
    )
    graph = Graph.read(onnx.load(str(path)), {"", "gru", "lstm", "rotary"})
    assert graph.leaving(graph.region("gru")) == ["y"]
    assert graph.leaving(graph.region("rotary")) == ["table"]


def _one_float() -> onnx.TensorProto:
    return onnx.numpy_helper.from_array(np.ones(1, np.float32))


@pytest.mark.parametrize("style", ["dynamo", "torchscript"])
def test_a_clean_model_has_no_divergence(tmp_path, style):
    path = _model(tmp_path / "m.onnx", style)
    before = sha256_file(path)
    loc = _localise(path)
    assert loc.first is None and loc.verdict.startswith("no divergence")
    assert [b.path for b in loc.boundaries] == ["a", "b", ""]  # the order calls finish
    assert all(b.status == "pass" for b in loc.boundaries)
    assert sha256_file(path) == before and sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


def test_a_fault_in_a_submodule_names_it(tmp_path):
    loc = _localise(_model(tmp_path / "m.onnx", three=3.5))
    assert loc.first is not None and loc.first.path == "b"
    assert loc.first.inputs_status == "pass" and loc.first.ops == {"Mul": 1}
    assert loc.verdict.startswith("first divergence: b (")
    assert "<- first divergence" in render(loc)


def test_a_fault_in_the_parents_own_op_names_the_parent(tmp_path):
    loc = _localise(_model(tmp_path / "m.onnx", one=1.25))
    statuses = {b.path: (b.status, b.inputs_status) for b in loc.boundaries}
    assert statuses["a"] == ("pass", "pass")
    assert statuses["b"] == ("fail", "fail")  # b only passed the error on
    assert loc.first is not None and loc.first.path == ""
    assert "own ops (Add x1)" in loc.verdict


def test_a_model_without_scopes_lists_every_submodule_as_unmatched(tmp_path):
    path = _model(tmp_path / "m.onnx", style="torchscript")
    model = onnx.load(str(path))
    for node in model.graph.node:
        node.name = ""
    onnx.save(model, str(path))
    loc = _localise(path)
    assert loc.scope_source == "none"
    assert [b.status for b in loc.boundaries] == ["unmatched", "unmatched", "pass"]
    assert "records no module scopes" in loc.boundaries[0].reason


def test_pairing_by_shape_then_by_value_then_by_size():
    a, b = np.zeros((2, 3)), np.zeros((4,))
    values = {"t1": np.ones((2, 3), np.float32), "t2": np.ones((4,), np.float32)}
    pairs, why = pair_tensors([a, b], ["t1", "t2"], values)
    assert {k: p.onnx for k, p in pairs.items()} == {0: "t1", 1: "t2"} and why == {}
    # two tensors of one shape (a rotary embedding's cos and sin): paired by their values
    cos, sin = np.full((2, 3), 0.5), np.full((2, 3), -0.25)
    values = {"s": sin.astype(np.float32), "c": cos.astype(np.float32)}
    pairs, _ = pair_tensors([cos, sin], ["s", "c"], values)
    assert {k: p.onnx for k, p in pairs.items()} == {0: "c", 1: "s"}
    # no tensor of the shape: not guessed, unless by size where asked (a moved reshape)
    values = {"r": np.ones((2, 3, 2), np.float32)}
    pairs, why = pair_tensors([np.zeros((2, 6))], ["r"], values)
    assert pairs == {} and "no ONNX tensor of shape [2, 6]" in why[0]
    pairs, why = pair_tensors([np.zeros((2, 6))], ["r"], values, by_size=True)
    assert pairs[0].onnx == "r" and pairs[0].reshaped and why == {}


def test_several_tensors_of_one_size_pair_by_value_reshaped():
    """Mistral's later layers read cos and sin as the first layer's scope unsqueezed them, in
    another shape than the layer's own call takes: two of one size, paired by value (left
    unpaired, the faulty layer could not be isolated and its parent was named)."""
    cos, sin = np.full((3, 4), 0.5), np.full((3, 4), -0.25)
    values = {"sin_u": sin[None].astype(np.float32), "cos_u": cos[None].astype(np.float32)}
    pairs, why = pair_tensors([cos, sin], ["sin_u", "cos_u"], values, by_size=True)
    assert {k: (p.onnx, p.reshaped) for k, p in pairs.items()} == {
        0: ("cos_u", True),
        1: ("sin_u", True),
    }
    assert why == {}


def test_a_float_made_only_by_choosing_among_constants_is_exact():
    """An attention mask's fill, Where(mask, 0, -inf), built in the first layer's scope and
    read by the next: exact, so the next layer is isolated with it as the model made it; a
    float computed from the inputs' floats is not."""
    from onnx import helper

    nodes = [
        helper.make_node("Where", ["mask", "zero", "fill"], ["bias"]),
        helper.make_node("Unsqueeze", ["bias", "axis"], ["bias_u"]),
        helper.make_node("Add", ["x", "bias_u"], ["y"]),
    ]
    consts = [
        onnx.numpy_helper.from_array(np.zeros(1, np.float32), "zero"),
        onnx.numpy_helper.from_array(np.full(1, -np.inf, np.float32), "fill"),
        onnx.numpy_helper.from_array(np.zeros(1, np.int64), "axis"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [2, 2]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 2]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2, 2])],
        consts,
    )
    found = Graph.read(helper.make_model(graph), {""})
    assert found.exact == {"bias", "bias_u"}


def test_pairing_by_size_takes_no_integer_tensor():
    """int8 models: DynamicQuantizeLinear's uint8 copy of an activation has its size but holds
    no value of it; paired, isolation would feed the reference's floats cast to uint8."""
    reference = [np.zeros((2, 6))]
    values = {"x_quantized": np.ones((2, 3, 2), np.uint8), "x_scale": np.ones((), np.float32)}
    pairs, why = pair_tensors(reference, ["x_quantized", "x_scale"], values, by_size=True)
    assert pairs == {} and "no ONNX tensor of shape [2, 6]" in why[0]
    values["x"] = np.ones((2, 3, 2), np.float32)  # the float tensor itself is still paired
    pairs, _ = pair_tensors(reference, ["x_quantized", "x", "x_scale"], values, by_size=True)
    assert pairs[0].onnx == "x" and pairs[0].reshaped


def test_the_float64_copy_of_a_graph_widens_constant_of_shape_s_default_zero():
    """ConstantOfShape without a value makes float32 zeros (`x.new_zeros(...)` exports so): left
    so, the float64 cross-check of a clean LSTM cell broke on Add(float32, float64) and a
    rounding-sized failure went unexplained."""
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    from tconform.localise.crosscheck import as_float64

    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["z"]),
        helper.make_node("Add", ["x", "z"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "zeros",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    wide = as_float64(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    x = np.arange(6, dtype=np.float64).reshape(2, 3) / 7
    (y,) = ReferenceEvaluator(wide).run(None, {"x": x})
    assert y.dtype == np.float64 and np.array_equal(y, x)


def test_localisation_measures_overflow_without_a_warning_line():
    """Outsider's finding: under -q, a float16 localisation still printed numpy's overflow
    warnings (the reference cast to float16, onnx.reference on a faulty cut)."""
    import warnings

    from tconform.localise import _quiet

    def overflows():
        return np.array([1e5]).astype(np.float16) * np.float16(10)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeWarning):
            overflows()
        assert np.isinf(_quiet(overflows)()[0])
